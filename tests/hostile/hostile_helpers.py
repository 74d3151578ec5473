"""Helpers the hostile tests share: the gpudash CLI as a real process with its own user directories, a
`vllm` stand-in (the vLLM double) that starts a child of its own, and a small loop-mounted filesystem."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

ENTRY = ["-c", "from gpudash.cli import main; main()"]
DOUBLE = Path(__file__).resolve().parents[1] / "doubles" / "vllm_double.py"
WAIT_S = 60.0  # generous bound on how long a test waits for what must happen promptly


def cli_env(home: Path) -> dict[str, str]:
    """The environment of a gpudash whose user directories all lie under `home`."""
    return {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"),
            "XDG_DATA_HOME": str(home / "data"), "XDG_STATE_HOME": str(home / "state"),
            "XDG_CACHE_HOME": str(home / "cache")}


def gpudash(*args: str, home: Path, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """Run the gpudash CLI in a fresh interpreter with its user dirs under `home`."""
    return subprocess.run([sys.executable, *ENTRY, *args], capture_output=True, text=True, env=cli_env(home),
                          timeout=timeout, **kw)


def vllm_with_a_child(tmp: Path) -> tuple[Path, Path]:
    """A `vllm` that starts a plain child (default SIGTERM action, so it dies of a group's TERM), writes
    the child's pid to the returned file, and then runs the vLLM double; (the executable, the pid file)."""
    exe, pidfile = tmp / "vllm", tmp / "child.pid"
    exe.write_text(f"""#!{sys.executable}
import os, runpy, subprocess, sys
sys.argv[0] = "vllm"
if not any(a.startswith("--help") for a in sys.argv):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    with open({str(pidfile)!r} + ".tmp", "w") as f:
        f.write(str(child.pid))
    os.replace({str(pidfile)!r} + ".tmp", {str(pidfile)!r})
runpy.run_path({str(DOUBLE)!r}, run_name="__main__")
""")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe, pidfile


def server_config(tmp: Path, binary: Path) -> Path:
    cfg = tmp / "c.toml"
    cfg.write_text(f'[[servers]]\nname = "v"\nkind = "vllm"\nmodel = "m"\nbinary = "{binary}"\n'
                   "[probe]\nenabled = false\n")
    return cfg


def alive_after_wait(pids: list[int], wait_s: float = WAIT_S) -> list[int]:
    """Pids still running after up to `wait_s` (zombies count as gone)."""
    end = time.monotonic() + wait_s
    alive = list(pids)
    while alive and time.monotonic() < end:
        alive = [p for p in alive if _running(p)]
        if alive:
            time.sleep(0.05)
    return alive


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def drain_pty(fd: int) -> bytearray:
    """Reads a pseudo-terminal's output in the background (a full terminal would stall the app)."""
    seen = bytearray()

    def run() -> None:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            seen.extend(chunk)

    threading.Thread(target=run, daemon=True).start()
    return seen


class Mount:
    """A loop-mounted ext2 image of `size` bytes at `path` (a real disk that can fill up or turn read-only)."""

    def __init__(self, tmp: Path, size: int):
        self.image, self.path = tmp / "fs.img", tmp / "mnt"
        self.path.mkdir()
        with self.image.open("wb") as f:
            f.truncate(size)
        for argv in (["mkfs.ext2", "-q", "-F", "-m", "0", str(self.image)],
                     ["mount", "-o", "loop", str(self.image), str(self.path)]):
            if shutil.which(argv[0]) is None:
                raise OSError(f"{argv[0]} is not installed")
            r = subprocess.run(argv, capture_output=True, text=True)
            if r.returncode != 0:
                raise OSError(f"{' '.join(argv[:2])} failed: {r.stderr.strip()}")

    def read_only(self) -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(self.path)], check=True)

    def fill(self, leave: int) -> None:
        """Take all but `leave` bytes of the free space (all of it when the file's own indirect blocks leave
        less than asked: a full disk)."""
        st = os.statvfs(self.path)
        left, chunk = max(0, st.f_bavail * st.f_frsize - leave), 1 << 20
        with (self.path / "filler").open("wb", buffering=0) as f:
            while left > 0:
                try:
                    left -= f.write(b"\0" * min(left, chunk))
                except OSError as err:
                    if err.errno != errno.ENOSPC:
                        raise
                    if chunk == 1:
                        return
                    chunk //= 2  # the file's own indirect blocks took some: go on in smaller pieces

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


def memory_capped(limit: int = 1 << 30):
    """A preexec_fn capping a child's address space at `limit` bytes: a read without a bound ends in
    MemoryError there instead of taking the box's memory."""
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def plant_fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def as_user(user: tuple[str, int, int], argv: list[str], **kw) -> subprocess.Popen:
    """`argv` started as `user` (setpriv: that uid and gid, no supplementary groups)."""
    _, uid, gid = user
    return subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *argv], **kw)
