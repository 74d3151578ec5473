"""sd_notify without libsystemd: the messages reach the socket systemd names, in either of its address forms;
the watchdog is pinged only for this process and at most a few times a timeout; a reader that falls behind
never blocks the sampler (the run's end-to-end use is in tests/test_systemd_unit.py)."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

from gpudash.runtime.sd_notify import Notifier


def _listener(address: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(address)
    s.settimeout(2)
    return s


def test_messages_reach_a_path_and_an_abstract_socket(tmp_path: Path) -> None:
    for name, bound in ((str(tmp_path / "n.sock"), str(tmp_path / "n.sock")),
                        (f"@gpudash-test-{os.getpid()}", f"\0gpudash-test-{os.getpid()}")):
        with _listener(bound) as s:
            notifier = Notifier.from_env({"NOTIFY_SOCKET": name})
            assert notifier is not None and notifier.watchdog_s is None
            notifier.ready("sampling sim:h200 every 1 s")
            notifier.stopping()
            assert s.recv(4096) == b"READY=1\nSTATUS=sampling sim:h200 every 1 s"
            assert s.recv(4096) == b"STOPPING=1"


def test_no_socket_or_another_kind_of_address_sends_nothing() -> None:
    assert Notifier.from_env({}) is None
    assert Notifier.from_env({"NOTIFY_SOCKET": "vsock:2:1234"}) is None


def test_the_watchdog_is_this_processs_and_pinged_a_few_times_a_timeout(tmp_path: Path) -> None:
    address = str(tmp_path / "w.sock")
    other = Notifier.from_env({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert other is not None and other.watchdog_s is None  # systemd meant another process
    with _listener(address) as s:
        notifier = Notifier.from_env({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "60000000",
                                      "WATCHDOG_PID": str(os.getpid())})
        assert notifier is not None and notifier.watchdog_s == 60
        for _ in range(100):  # 100 ticks at once: one ping, the next a quarter timeout later
            notifier.tick(None)  # type: ignore[arg-type]
        s.setblocking(False)
        assert s.recv(4096) == b"WATCHDOG=1"
        try:
            extra = s.recv(4096)
        except BlockingIOError:
            extra = None
        assert extra is None


def test_a_reader_that_falls_behind_never_blocks_the_sender(tmp_path: Path) -> None:
    """The kernel queues a few datagrams (net.unix.max_dgram_qlen, 10 by default); past that a blocking send
    would wait for the reader, stalling the sampler thread that pings the watchdog."""
    with _listener(str(tmp_path / "full.sock")):
        notifier = Notifier(str(tmp_path / "full.sock"), watchdog_s=1e-9)
        sent: list[bool] = []
        sender = threading.Thread(target=lambda: sent.extend(notifier.send("WATCHDOG=1") for _ in range(100)),
                                  daemon=True)
        sender.start()
        sender.join(timeout=30)  # a guard against a hang, not a speed limit: the sends take microseconds
        assert not sender.is_alive(), "a send blocked on the full queue"
        assert sent[0] and not all(sent)  # the surplus is dropped
