"""CSV and JSON export on an install without pyarrow (`pip install '.[llama]'` has none): `gpudash export`
and the function the TUI's History `e` calls both work; only Parquet asks for the extra.

Each case runs in a subprocess whose import system refuses pyarrow, as on such an install."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpudash.config import Config
from gpudash.records import GpuSample, HostSample, Snapshot
from gpudash.store import SESSION_TABLES, Store, StoreWriter

from cli_helpers import env

# A meta path finder that answers every import of pyarrow (or a submodule) with ImportError, first in line.
NO_PYARROW = """
import sys
class NoPyarrow:
    def find_spec(self, name, path=None, target=None):
        if name == "pyarrow" or name.startswith("pyarrow."):
            raise ImportError(f"No module named {name!r} (blocked: this install has no pyarrow)")
        return None
sys.meta_path.insert(0, NoPyarrow())
for name in [m for m in sys.modules if m == "pyarrow" or m.startswith("pyarrow.")]:
    del sys.modules[name]
"""

CLI = NO_PYARROW + """
from gpudash.cli import main
try:
    main()
finally:
    assert "pyarrow" not in sys.modules
"""

# What gpudash/tui/history.py does for History `e`: open the store read-only, export_session.
TUI_EXPORT = NO_PYARROW + """
from pathlib import Path
from gpudash.store import Store
from gpudash.store.export import ExportError, export_session
db, fmt, out = sys.argv[1:]
with Store.open(Path(db), writing=False) as store:
    try:
        done = export_session(store, store.resolve_session("latest"), fmt, Path(out))
    except ExportError as err:
        print(f"ExportError: {err}")
        sys.exit(3)
print(sum(e.rows for e in done))
assert "pyarrow" not in sys.modules
"""


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "h.db"
    store = Store.open(path)
    sid = store.begin_session("sim:rtx5080+rtx3090", Config())
    writer = StoreWriter(path, sid)
    for t in range(4):
        ts = 1000.0 + t
        writer.submit(Snapshot(ts, t, "sim:rtx5080+rtx3090",
                               gpus=tuple(GpuSample(ts, i, f"u{i}", "g", 1.0) for i in range(2)),
                               host=HostSample(ts, 5.0)))
    writer.close()
    store.end_session(sid)
    store.close()
    return path


def _python(tmp: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env(tmp),
                          cwd=tmp, timeout=120)


def _rows(path: Path, fmt: str) -> list[dict]:
    if fmt == "csv":
        with path.open(newline="") as f:
            return list(csv.DictReader(f))
    return json.loads(path.read_text())


def test_the_blocker_really_hides_pyarrow(tmp_path: Path) -> None:
    proc = _python(tmp_path, NO_PYARROW + "import pyarrow")
    assert proc.returncode == 1 and "ImportError" in proc.stderr and "blocked" in proc.stderr


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_cli_export_needs_no_pyarrow(tmp_path: Path, db: Path, fmt: str) -> None:
    out = tmp_path / "out"
    proc = _python(tmp_path, CLI, "export", "latest", "--db", str(db), "--format", fmt, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "pyarrow" not in proc.stdout + proc.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(f"{t}.{fmt}" for t in SESSION_TABLES)
    gpus = _rows(out / f"gpu_samples.{fmt}", fmt)
    assert len(gpus) == 8 and {r["source"] for r in gpus} == {"sim:rtx5080+rtx3090"}


@pytest.mark.parametrize("fmt", ["csv", "json"])
def test_history_e_export_needs_no_pyarrow(tmp_path: Path, db: Path, fmt: str) -> None:
    out = tmp_path / "tui-out"
    proc = _python(tmp_path, TUI_EXPORT, str(db), fmt, str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert int(proc.stdout.split()[-1]) > 0
    assert len(_rows(out / f"host_samples.{fmt}", fmt)) == 4


def test_parquet_without_pyarrow_is_one_usage_error_and_writes_nothing(tmp_path: Path, db: Path) -> None:
    out = tmp_path / "pq"
    proc = _python(tmp_path, CLI, "export", "latest", "--db", str(db), "--format", "parquet", "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == ("gpudash: Parquet export needs pyarrow; install it with: "
                                   "pip install 'gpudash[parquet]'")
    assert not out.exists()
    tui = _python(tmp_path, TUI_EXPORT, str(db), "parquet", str(out))
    assert tui.returncode == 3 and "pip install 'gpudash[parquet]'" in tui.stdout
