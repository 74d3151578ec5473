"""systemd's readiness and watchdog messages (sd_notify(3)) for `record` and `serve` under `Type=notify`.

The protocol is one datagram per message to the unix socket that $NOTIFY_SOCKET names ("@" for Linux's
abstract namespace); libsystemd is not needed for that, and a send never blocks. READY=1 goes once sampling runs, STOPPING=1 when
the run closes, and WATCHDOG=1 from the sampler's own ticks, so a sampler that hangs (an NVML call that
never returns) stops the pings and systemd restarts the service after WatchdogSec= (WATCHDOG_USEC). Outside
systemd there is no $NOTIFY_SOCKET and nothing is sent. A failed send is dropped: systemd then says why.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping

from gpudash.records import Snapshot

PINGS_PER_TIMEOUT = 4  # sd_watchdog_enabled(3) asks for a ping at least every half timeout; a quarter is safe


class Notifier:
    """Sends sd_notify messages to one socket address; `tick` is a sampler sink."""

    def __init__(self, address: str, watchdog_s: float | None = None) -> None:
        self.address = "\0" + address[1:] if address.startswith("@") else address
        self.watchdog_s = watchdog_s
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.setblocking(False)  # a reader that falls behind loses a message; the sampler never waits
        self._last_ping = float("-inf")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Notifier | None:
        """The notifier systemd asked for, or None outside a notify unit (or for a socket other than a unix
        path or abstract name). The watchdog is this process's only when WATCHDOG_PID, if set, is its pid."""
        address = environ.get("NOTIFY_SOCKET", "")
        if not address.startswith(("/", "@")):
            return None
        usec, pid = environ.get("WATCHDOG_USEC", ""), environ.get("WATCHDOG_PID", "")
        mine = not pid or pid == str(os.getpid())
        watchdog = int(usec) / 1e6 if usec.isdigit() and int(usec) > 0 and mine else None
        return cls(address, watchdog)

    def send(self, message: str) -> bool:
        try:
            self._sock.sendto(message.encode(), self.address)
        except OSError:
            return False
        return True

    def ready(self, status: str) -> None:
        self.send(f"READY=1\nSTATUS={status}")

    def tick(self, _snap: Snapshot) -> None:
        """A sampler tick happened: ping the watchdog, at most PINGS_PER_TIMEOUT times a timeout."""
        now = time.monotonic()
        if self.watchdog_s is not None and now - self._last_ping >= self.watchdog_s / PINGS_PER_TIMEOUT:
            self._last_ping = now
            self.send("WATCHDOG=1")

    def stopping(self) -> None:
        self.send("STOPPING=1")
        self._sock.close()
