"""`gpudash fleet` against a Prometheus that is down, slow, dripping its body or its headers, answering garbage,
an error or far too much: one line starting "gpudash: ", exit 1, within the timeout, in bounded memory, never
a traceback. The misbehaving servers are real HTTP servers on 127.0.0.1 started by this module."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpudash.launcher.health import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cli"))
from cli_helpers import env, run  # noqa: E402
from fleet_helpers import serving  # noqa: E402

HUGE_BYTES = 512 << 20


class _Handler(BaseHTTPRequestHandler):
    mode = ""

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's name): the client POSTs its queries, as the API allows
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            getattr(self, "_" + self.server.mode)()  # type: ignore[attr-defined]
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _head(self, code: int = 200, ctype: str = "application/json", length: int | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.end_headers()

    def _garbage(self) -> None:
        body = b"<html><body>Welcome to nginx!</body></html>"
        self._head(200, "text/html", len(body))
        self.wfile.write(body)

    def _error(self) -> None:
        body = b'{"status":"error","errorType":"bad_data","error":"1:1: parse error: unexpected character"}'
        self._head(400, length=len(body))
        self.wfile.write(body)

    def _slow(self) -> None:
        time.sleep(8)
        self._head(200, length=2)
        self.wfile.write(b"{}")

    def _drip(self) -> None:
        self._head(200)
        self.wfile.write(b'{"status":"success","data":{"resultType":"vector","result":[')
        for _ in range(100):
            self.wfile.write(b" ")
            self.wfile.flush()
            time.sleep(0.2)

    def _drip_headers(self) -> None:
        """The status line, then one byte of a header every 0.2 s: no read ever waits long (issue 37.2)."""
        self.wfile.write(b"HTTP/1.1 200 OK\r\n")
        self.wfile.flush()
        for byte in b"X-Slow: " + b"a" * 200:
            self.wfile.write(bytes([byte]))
            self.wfile.flush()
            time.sleep(0.2)

    def _huge(self) -> None:
        self._head(200)
        self.wfile.write(b'{"status":"success","data":{"resultType":"vector","result":[')
        row = b'{"metric":{"instance":"x"},"value":[1,"1"]},' * 1000
        sent = 0
        while sent < HUGE_BYTES:
            self.wfile.write(row)
            sent += len(row)


@pytest.fixture
def bad_prometheus(request: pytest.FixtureRequest) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.mode = request.param  # type: ignore[attr-defined]
    with serving(server) as port:
        yield f"http://127.0.0.1:{port}"


# The fleet command with its own peak resident memory written at exit: VmHWM of /proc/self/status is the
# high-water mark of this program's address space alone. The rusage of a spawned child is not: Linux keeps,
# across exec, the peak of the address space the child was spawned from, which under posix_spawn's vfork is
# the whole test process (1.8 GiB late in a full run).
PEAK_ENTRY = ["-c", """
import atexit, os, sys
def peak():
    hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    open(os.environ["PEAK_FILE"], "w").write(hwm.split()[1])
atexit.register(peak)
from gpudash.cli import main
main()
"""]


def _fleet(tmp: Path, url: str, timeout: float = 1.0) -> tuple[int, str, float, int]:
    """Exit code, stderr, seconds taken and peak RSS in KiB of one `gpudash fleet` process."""
    argv = [sys.executable, *PEAK_ENTRY, "fleet", "--prometheus", url, "--timeout", str(timeout)]
    err_path, peak_path = tmp / "stderr.txt", tmp / "peak_kib.txt"
    t0 = time.monotonic()
    with err_path.open("w") as err:
        proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=err, env={**env(tmp), "PEAK_FILE": str(peak_path)},
                              cwd=tmp, timeout=60)
    return proc.returncode, err_path.read_text(), time.monotonic() - t0, int(peak_path.read_text())


@pytest.mark.parametrize("bad_prometheus, words", [
    ("garbage", "no Prometheus JSON"),
    ("error", "refused the query: 1:1: parse error"),
    ("slow", "did not answer within 1 s"),
    ("drip", "did not answer within 1 s"),
    ("drip_headers", "did not answer within 1 s"),
    ("huge", "answered more than 32 MiB"),
], indirect=["bad_prometheus"])
def test_a_bad_prometheus_is_one_line_within_the_timeout(tmp_path: Path, bad_prometheus: str, words: str) -> None:
    code, err, took, peak_kib = _fleet(tmp_path, bad_prometheus)
    assert code == 1, err
    assert err.startswith("gpudash: ") and err.count("\n") == 1 and words in err and "Traceback" not in err, err
    assert bad_prometheus in err  # it names the URL it asked
    assert took < 8, took  # the slow server would take 8 s; the drip 20 s; the huge one sends 512 MiB
    assert peak_kib < 400 * 1024, peak_kib  # at most the 32 MiB cap is held, never the whole answer


def test_prometheus_down_is_one_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    proc = run(tmp_path, "fleet", "--prometheus", url)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"gpudash: cannot reach Prometheus at {url}") and proc.stderr.count("\n") == 1


@pytest.mark.parametrize("args, words", [
    ((), "no Prometheus to ask: pass --prometheus URL"),
    (("--prometheus", "http://x:9090", "--timeout", "0"), "--timeout expects seconds from 0.1 to 120"),
    (("--prometheus", "http://x:9090", "--timeout", "soon"), "--timeout expects seconds from 0.1 to 120"),
    (("--prometheus", "prometheus.lan:9090"), "is not Prometheus' base URL; write it as http://HOST:PORT"),
    (("--prometheus", "http://x:9090/?q=1"), "is not Prometheus' base URL"),
])
def test_usage_errors_exit_2_without_asking_anyone(tmp_path: Path, args: tuple[str, ...], words: str) -> None:
    proc = run(tmp_path, "fleet", *args)
    assert proc.returncode == 2 and words in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("gpudash: "), proc.stderr  # every error of this command in one style


def test_a_bad_fleet_url_in_the_config_is_one_clear_line(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[fleet]\nprometheus = "ftp://x"\n')
    proc = run(tmp_path, "--config", str(config), "fleet")
    assert proc.returncode == 2 and "fleet.prometheus" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_bad_fleet_url_for_launch_is_a_usage_error_before_the_screen(tmp_path: Path) -> None:
    proc = run(tmp_path, "launch", "--sim", "h200", "--no-record", "--fleet", "prometheus.lan:9090")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "--fleet: 'prometheus.lan:9090' is not Prometheus' base URL" in proc.stderr
