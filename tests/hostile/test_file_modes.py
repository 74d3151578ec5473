"""gpudash sets modes only on files and directories it creates: a `--db` it refuses keeps its mode and
bytes, a symlink is never followed to change its target, and what gpudash does create is 0600 / 0700.
Through the real CLI (history, record) and Store.open."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpudash.store import Store, StoreError
from hostile_helpers import gpudash


def _mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def test_a_refused_db_keeps_its_mode_and_bytes(tmp_path: Path) -> None:
    text = tmp_path / "n.txt"
    text.write_text("hi\n")
    text.chmod(0o644)
    r = gpudash("history", "--db", str(text), home=tmp_path)
    assert r.returncode == 2 and "not a usable gpudash database" in r.stderr, r.stderr
    r = gpudash("record", "--db", str(text), "--sim", "h200", "--duration", "0.2", "--quiet", home=tmp_path)
    assert r.returncode == 2, r.stderr
    assert _mode(text) == 0o644 and text.read_text() == "hi\n"


def test_a_symlinked_db_is_used_but_its_target_keeps_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "theirs" / "shared.db"
    target.parent.mkdir(mode=0o755)
    Store.open(target).close()  # a gpudash database, but not made by this run: its owner chose 0644
    target.chmod(0o644)
    link = tmp_path / "link.db"
    link.symlink_to(target)
    r = gpudash("record", "--db", str(link), "--sim", "h200", "--duration", "0.3", "--quiet", home=tmp_path)
    assert r.returncode == 0, r.stderr
    assert _mode(target) == 0o644 and _mode(target.parent) == 0o755
    assert link.is_symlink()
    with Store.open(target, writing=False) as store:
        assert len(store.sessions()) == 1  # it was recorded into, through the link


def test_a_dangling_symlink_is_refused_and_nothing_is_created_through_it(tmp_path: Path) -> None:
    link = tmp_path / "link.db"
    link.symlink_to(tmp_path / "elsewhere.db")  # in a directory that exists: SQLite would create it there
    with pytest.raises(StoreError, match="symlink .* does not exist"):
        Store.open(link)
    assert not (tmp_path / "elsewhere.db").exists()


def test_what_gpudash_creates_is_private_and_what_exists_keeps_its_mode(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    db = tmp_path / "new" / "deeper" / "g.db"
    Store.open(db).close()
    assert _mode(db) == 0o600 and _mode(db.parent) == 0o700 and _mode(db.parent.parent) == 0o700
    assert _mode(tmp_path) == 0o755  # an existing directory is not gpudash's to change
