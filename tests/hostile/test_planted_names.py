"""Every file gpudash writes beside its target is created under a name nobody can plant in advance, and
what it reads there is never a link, a FIFO or a device: a link planted at the names it used to predict
(`.NAME.PID.tmp`, `.TABLE.FMT.partial`) points at a file of the victim's, which must stay as it was, and a
FIFO or a link to /dev/zero at a target must neither hang gpudash nor grow its memory. The real code paths:
the deploy command (in-process, so its pid is known, and as a CLI), the export, the demo model, the tuned
knobs, the server log's latest link."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpudash.commands.deploy import deploy, target_files
from gpudash.config import Config
from gpudash.launcher.llama.gguf_model import DemoModelShape, write_demo_model
from gpudash.launcher.server_logs import point_latest
from gpudash.private_fs import UnsafeFileError, read_capped, write_atomic
from gpudash.store import Store, StoreWriter
from gpudash.store.export import ExportError, export_session
from hostile_helpers import WAIT_S, as_user, gpudash, memory_capped, plant_fifo

VICTIM = "root's file: must stay as it was\n"
TINY = DemoModelShape(layers=1, embedding=64, heads=2, heads_kv=2, feed_forward=128, context=512)


def _victim(tmp: Path) -> Path:
    victim = tmp / "victim.conf"
    victim.write_text(VICTIM)
    return victim


def _finishes(work, fifo: Path) -> BaseException | None | str:
    """Run `work` on a thread; 'hung' if it still runs after WAIT_S (then the FIFO is opened from this end
    to let it go), else what it raised (None when it returned)."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            work()
            raised.append(None)
        except BaseException as err:  # noqa: BLE001 - handed to the test
            raised.append(err)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(WAIT_S)
    if t.is_alive():
        fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # a reader and a writer: the blocked open returns
        t.join(WAIT_S)
        os.close(fd)
        return "hung"
    return raised[0]


# --- the helper itself


def test_write_atomic_never_follows_a_planted_name_and_replaces_a_link_at_the_target(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    target = tmp_path / "out.txt"
    target.symlink_to(victim)
    write_atomic(target, "new\n")
    assert victim.read_text() == VICTIM
    assert not target.is_symlink() and target.read_text() == "new\n" and target.stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt", "victim.conf"]  # no temporary left


@pytest.mark.parametrize("planted", ["link", "fifo", "zero", "dir", "big"])
def test_read_capped_refuses_what_is_not_a_small_regular_file(tmp_path: Path, planted: str) -> None:
    path = tmp_path / "f"
    if planted == "link":
        path.symlink_to(_victim(tmp_path))
    elif planted == "fifo":
        plant_fifo(path)
    elif planted == "zero":
        path.symlink_to("/dev/zero")
    elif planted == "dir":
        path.mkdir()
    else:
        path.write_bytes(b"x" * 101)
    with pytest.raises(UnsafeFileError, match=str(path)):
        read_capped(path, 100)


# --- deploy (issue 41 item 1)


def test_deploy_writes_through_no_link_planted_at_its_temporary_names(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victim = _victim(tmp_path)
    names = [p.name for p in target_files("rules")]
    for name in names:  # the names today's code predicts from its pid (this process: the command runs here)
        (out / f".{name}.{os.getpid()}.tmp").symlink_to(victim)
    r = CliRunner().invoke(deploy, ["rules", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert victim.read_text() == VICTIM
    for name in names:
        assert not (out / name).is_symlink() and (out / name).stat().st_uid == os.geteuid()


@pytest.mark.parametrize("planted", ["fifo", "zero"])
def test_deploy_compares_with_a_fifo_or_dev_zero_without_hanging_or_growing(tmp_path: Path, planted: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    name = target_files("rules")[0].name
    if planted == "fifo":
        plant_fifo(out / name)
    else:
        (out / name).symlink_to("/dev/zero")
    r = gpudash("deploy", "rules", "--out", str(out), home=tmp_path, timeout=WAIT_S,
                preexec_fn=memory_capped())
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"{out / name} already exists and differs" in r.stderr
    forced = gpudash("deploy", "rules", "--out", str(out), "--force", home=tmp_path, timeout=WAIT_S,
                     preexec_fn=memory_capped())
    assert forced.returncode == 0, forced.stderr
    assert not (out / name).is_symlink() and (out / name).read_text() == target_files("rules")[0].read_text()


# --- export (item 2)


@pytest.fixture
def recorded(tmp_path: Path) -> Store:
    store = Store.open(tmp_path / "g.db")
    sid = store.begin_session("sim:h200", Config())
    StoreWriter(store.path, sid).close()
    store.end_session(sid)
    yield store
    store.close()


def test_export_writes_through_no_link_planted_at_its_partial_names(recorded: Store, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir(mode=0o777)
    victim = _victim(tmp_path)
    for table in ("sessions", "ticks", "events"):
        (out / f".{table}.csv.{'partial'}").symlink_to(victim)
    export_session(recorded, recorded.sessions()[0].id, "csv", out)
    assert victim.read_text() == VICTIM
    assert not (out / "sessions.csv").is_symlink() and (out / "sessions.csv").stat().st_mode & 0o777 == 0o600


def test_export_does_not_hang_on_a_fifo_planted_at_a_partial_name(recorded: Store, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    fifo = plant_fifo(out / ".ticks.json.partial")
    sid = recorded.sessions()[0].id
    outcome = _finishes(lambda: export_session(recorded, sid, "json", out), fifo)
    assert outcome is None, outcome
    assert (out / "ticks.json").is_file() and not (out / "ticks.json").is_symlink()


def test_export_names_a_fifo_at_a_target_and_force_replaces_it(recorded: Store, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    plant_fifo(out / "ticks.csv")
    sid = recorded.sessions()[0].id
    with pytest.raises(ExportError, match="already exist"):
        export_session(recorded, sid, "csv", out)
    export_session(recorded, sid, "csv", out, force=True)
    assert (out / "ticks.csv").is_file()


# --- demo-model (item 3)


def test_demo_model_writes_through_no_link_planted_at_its_temporary_name(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    out = tmp_path / "m.gguf"
    (tmp_path / f".m.gguf.{os.getpid()}.tmp").symlink_to(victim)
    write_demo_model(out, TINY)
    assert victim.read_text() == VICTIM
    assert not out.is_symlink() and out.read_bytes()[:4] == b"GGUF"


# --- the tuned knobs (not atomic at all before)


def test_tuned_knobs_are_written_through_no_link_and_a_fifo_is_refused(tmp_path: Path, monkeypatch) -> None:
    from gpudash.config import ConfigError
    from gpudash.runtime.tuned import load_tuned, save_tuned, tuned_path

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    victim = _victim(tmp_path)
    path = tuned_path("box")
    path.parent.mkdir(parents=True)
    path.symlink_to(victim)
    with pytest.raises(ConfigError, match="symlink"):
        save_tuned({"outstanding": 3}, "box")
    assert victim.read_text() == VICTIM
    path.unlink()
    fifo = plant_fifo(path)
    outcome = _finishes(lambda: load_tuned("box"), fifo)
    assert outcome is None or isinstance(outcome, ConfigError), outcome
    path.unlink()
    save_tuned({"outstanding": 3}, "box")
    assert load_tuned("box") == (path, {"outstanding": 3}) and path.stat().st_mode & 0o777 == 0o600


# --- the server log's latest link


def test_the_latest_log_link_is_made_whatever_sits_at_its_old_temporary_name(tmp_path: Path) -> None:
    log = tmp_path / "v.20260101-000000-1-1.log"
    log.write_text("=== gpudash\n")
    (tmp_path / f".v.log.{os.getpid()}.tmp").mkdir()  # a name today's code would take and cannot
    point_latest(log, "v")
    assert (tmp_path / "v.log").is_symlink() and os.readlink(tmp_path / "v.log") == log.name


def test_another_users_links_in_a_shared_folder_reach_no_root_file(tmp_path: Path, other_user, shared_dir: Path) -> None:
    """Issue 41 item 1 as it happened: a second account plants links at deploy's predictable names in a
    folder every user can write (mode 1777), root deploys into it; root's file stays as it was and the
    deployed files are root's own regular files, not that user's links."""
    victim = _victim(tmp_path)  # root's, in a folder only root can enter: the other user cannot read it
    names = [p.name for p in target_files("rules")]
    for name in names:
        assert as_user(other_user, ["ln", "-s", str(victim), str(shared_dir / f".{name}.{os.getpid()}.tmp")]).wait() == 0
    r = CliRunner().invoke(deploy, ["rules", "--out", str(shared_dir)])
    assert r.exit_code == 0, r.output
    assert victim.read_text() == VICTIM
    for name in names:
        st = (shared_dir / name).lstat()
        assert not (shared_dir / name).is_symlink() and st.st_uid == 0, name
