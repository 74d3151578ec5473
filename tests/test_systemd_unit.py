"""The systemd unit works as shipped: `gpudash deploy systemd` writes it, and its ExecStart runs with the
unit's environment (its XDG variables, HOME=/) on a root file system that is read-only except the unit's
StateDirectory=, LogsDirectory= and CacheDirectory= (ProtectSystem=strict under DynamicUser=). The
read-only root is a private mount namespace (unshare), which needs root: elsewhere the test skips, except
where GPUDASH_REQUIRE_SANDBOX=1 (.ci/run), where it fails.

The sandbox differs from systemd's in two ways it says: the unit's directories are folders of the test
(systemd's %S, %L and %C stand for /var/lib, /var/log and /var/cache), and the private temporary folder is
/var/tmp alone (PrivateTmp= gives /tmp too, which holds the test's own folders here). The unit is
Type=notify with a watchdog: the run sends its READY=1, WATCHDOG=1 and STOPPING=1 datagrams to a socket of
the test named by NOTIFY_SOCKET, as systemd would give it.

`systemd-analyze verify` and `systemd-analyze security --offline=yes` (systemd >= 250; Debian 12 has 252)
check the unit itself; the score is printed and must stay at or below SECURITY_MAX (8.4 before the sandbox
settings, 1.9 with them on systemd 252)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpudash.launcher.health import free_port

from unit_file import environment, exec_argv, service

REPO = Path(__file__).resolve().parent.parent
SECURITY_MAX = 2.0  # systemd-analyze's exposure score, 0 (locked down) to 10; 8.4 before the sandbox settings


def _sandbox_or_skip() -> None:
    why = None
    if os.geteuid() != 0:
        why = "a private read-only mount namespace needs root"
    elif shutil.which("unshare") is None:
        why = "unshare (util-linux) is not installed"
    elif subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True).returncode:
        why = "this machine refuses new mount namespaces"
    if why is None:
        return
    if os.environ.get("GPUDASH_REQUIRE_SANDBOX") == "1":
        pytest.fail(f"GPUDASH_REQUIRE_SANDBOX=1 but {why}")
    pytest.skip(why)


def _unit_file(tmp_path: Path) -> Path:
    out = tmp_path / "unit"
    r = subprocess.run([sys.executable, "-m", "gpudash", "deploy", "systemd", "--out", str(out)],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    (path,) = out.glob("*.service")
    return path


class Sandbox:
    """The unit's directories, environment and ExecStart, ready to run in the read-only root."""

    def __init__(self, tmp_path: Path) -> None:
        unit = service(_unit_file(tmp_path).read_text())
        assert unit["DynamicUser"] == "yes" and unit["ProtectSystem"] == "strict"
        assert unit["Type"] == "notify" and unit["EnvironmentFile"] == "-/etc/gpudash/gpudash.env"
        roots = {"%S": tmp_path / "var-lib", "%L": tmp_path / "var-log", "%C": tmp_path / "var-cache"}
        self.dirs = {key: roots[spec] / unit[key] for key, spec in
                     (("StateDirectory", "%S"), ("LogsDirectory", "%L"), ("CacheDirectory", "%C"))}
        self.private_tmp = tmp_path / "private-tmp"
        for d in [*self.dirs.values(), self.private_tmp]:
            d.mkdir(parents=True)  # systemd makes them, owned by the dynamic user
        self.env = {"HOME": "/", "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
        for name, value in environment(unit).items():
            for spec, path in roots.items():
                value = value.replace(spec, str(path))
            self.env[name] = value
        assert {"XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME"} <= set(self.env)
        # systemd's notify socket and watchdog (WatchdogSec= in microseconds), a socket of the test's own
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.notify.bind(str(tmp_path / "notify.sock"))
        self.notify.settimeout(0.2)
        self._said: list[str] = []
        self._listening = threading.Thread(target=self._listen, daemon=True)  # as systemd reads, at once
        self._listening.start()
        self.env["NOTIFY_SOCKET"] = str(tmp_path / "notify.sock")
        self.env["WATCHDOG_USEC"] = str(int(unit["WatchdogSec"]) * 1_000_000)
        argv = exec_argv(unit)
        assert Path(argv[0]).name == "gpudash" and Path(argv[0]).is_file()  # this installation's, written by deploy
        # No NVIDIA driver here: a simulated rig stands in for --no-sim; the exporter binds a free local port.
        self.argv = [a for a in argv if a != "--no-sim"] + ["--sim", "h200"]
        self.argv[self.argv.index("--prometheus") + 1] = f"127.0.0.1:{free_port()}"
        self.db = self.dirs["StateDirectory"] / "gpudash.db"  # XDG_DATA_HOME/gpudash is the StateDirectory

    def script(self, argv: list[str]) -> list[str]:
        """The command line that runs argv with only the unit's environment, in a mount namespace whose root
        is read-only except the unit's directories (and a private /var/tmp)."""
        binds = [f"mount --bind {shlex.quote(str(d))} {shlex.quote(str(d))}" for d in self.dirs.values()]
        if Path("/var/tmp").is_dir():
            binds.append(f"mount --bind {shlex.quote(str(self.private_tmp))} /var/tmp")
        script = "set -e\n" + "\n".join(binds) + "\nmount -o remount,bind,ro /\n" + \
            "exec env -i " + " ".join(shlex.quote(f"{k}={v}") for k, v in self.env.items()) + " " + shlex.join(argv)
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]

    def run(self, argv: list[str], timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run(self.script(argv), capture_output=True, text=True, timeout=timeout)

    def _listen(self) -> None:
        while self.notify.fileno() != -1:
            try:
                self._said.append(self.notify.recv(4096).decode())
            except TimeoutError:
                continue
            except OSError:
                return

    def notified(self) -> list[str]:
        """The sd_notify messages sent so far (the run has ended: nothing more comes)."""
        self.notify.close()
        self._listening.join(timeout=5)
        return self._said

    def session(self) -> tuple[str, float | None, int]:
        with sqlite3.connect(self.db) as conn:
            (source, ended), = conn.execute("SELECT source, ended FROM sessions").fetchall()
            ticks = conn.execute("SELECT COUNT(*) FROM gpu_samples").fetchone()[0]
        return source, ended, ticks


def test_the_unit_records_with_a_read_only_root(tmp_path: Path) -> None:
    _sandbox_or_skip()
    box = Sandbox(tmp_path)
    stray = box.run(["touch", str(tmp_path / "stray")])  # the sandbox is real: a write anywhere else fails
    assert stray.returncode != 0 and "Read-only file system" in stray.stderr

    box.env["WATCHDOG_USEC"] = "1000000"  # a 1 s watchdog, so 3 s of ticks every 0.1 s ping it several times
    r = box.run([*box.argv, "--duration", "3", "--interval", "0.1"])
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    source, ended, ticks = box.session()
    assert source == "sim:h200" and ended is not None and ticks > 0
    said = box.notified()
    assert said[0].startswith("READY=1\nSTATUS=sampling sim:h200") and said[-1] == "STOPPING=1", said
    assert 4 <= said.count("WATCHDOG=1") <= 4 * 3 + 1, said  # at most 4 a timeout, whatever the tick rate


def test_systemd_verifies_the_unit_and_scores_its_sandbox(tmp_path: Path) -> None:
    """`systemd-analyze verify` finds nothing and `security --offline=yes` scores it; the score is printed
    (pytest -s) so the record of it is the test's output."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        if os.environ.get("GPUDASH_REQUIRE_SANDBOX") == "1":
            pytest.fail("GPUDASH_REQUIRE_SANDBOX=1 but systemd-analyze is not installed (Debian: systemd)")
        pytest.skip("systemd-analyze is not installed (Debian: systemd)")
    unit = _unit_file(tmp_path)
    verify = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0 and unit.name not in verify.stdout + verify.stderr, verify.stdout + verify.stderr
    scored = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", str(unit)], capture_output=True,
                            text=True, timeout=60)
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", scored.stdout)
    assert found, scored.stdout + scored.stderr
    print(f"systemd-analyze security --offline=yes {unit.name}: {found[1]} {found[2]}")
    assert float(found[1]) <= SECURITY_MAX, scored.stdout


@pytest.mark.llama
def test_the_unit_serves_the_demo_with_a_read_only_root(tmp_path: Path, llama_server: str) -> None:
    """`serve` in place of `record` (as the unit says for a box whose servers gpudash runs): the demo's
    model goes to the CacheDirectory, its log to the LogsDirectory, the store to the StateDirectory."""
    _sandbox_or_skip()
    box = Sandbox(tmp_path)
    box.env["PATH"] = f"{Path(llama_server).parent}:{box.env['PATH']}"
    argv = [box.argv[0], "serve", *box.argv[2:]]
    proc = subprocess.Popen(box.script(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:  # unshare and sh exec: the pid is gpudash's
        deadline = time.monotonic() + 120
        logs: list[Path] = []
        while not any("ready" in line for line in _events(box.db)) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.5)
        logs = list((box.dirs["LogsDirectory"]).rglob("*.log"))
        proc.send_signal(signal.SIGTERM)  # the unit's KillSignal
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, f"{out}\n{err}"
    assert any("server.ready" in line for line in _events(box.db)), err
    assert logs and all(p.is_relative_to(box.dirs["LogsDirectory"]) for p in logs)
    assert list(box.dirs["CacheDirectory"].glob("demo-llama-*.gguf"))
    assert box.session()[1] is not None


def _events(db: Path) -> list[str]:
    """Event kinds recorded so far (the writer commits in batches); none before the file exists."""
    if not db.exists():
        return []
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            return [k for (k,) in conn.execute("SELECT kind FROM events")]
    except sqlite3.OperationalError:  # the tables are made by the first write
        return []
