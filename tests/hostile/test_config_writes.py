"""`W` (save_server) and `w` (save_engine_knobs) write the user's config file and nothing else: atomically (a full
disk leaves the old file whole, not one ending in `kind`), keeping its mode, owner, comments and layout; never
through a symlink another user planted in a writable config directory, never into a 0444 file as root, never
waiting on a FIFO; and a `servers` that is no list of tables is one sentence, not an AttributeError out of the
key handler. Real files, a real full filesystem (a loop mount), real users' ids."""

from __future__ import annotations

import os
import stat
import threading
import tomllib
from pathlib import Path

import pytest

from gpudash.config import ConfigError, load_config, save_engine_knobs, save_server
from hostile_helpers import Mount

ENTRY = {"name": "llamacpp-77", "kind": "llama.cpp", "url": "http://127.0.0.1:8080"}
MINE = '# my box\n[sampling]\ninterval_s = 2.0  # slow disk\n\n[engine]  # tuned by hand\nstaging_threads = 4\n'


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _nothing_beside(path: Path) -> None:
    """No temporary file was left beside the config."""
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


@pytest.mark.parametrize("save", [lambda p: save_server(p, ENTRY), lambda p: save_engine_knobs(p, {"staging_threads": 8})],
                         ids=["W", "w"])
def test_a_full_disk_leaves_the_config_whole(small_fs: Mount, save) -> None:
    path = small_fs.path / "conf" / "config.toml"
    path.parent.mkdir()
    # 40 bytes short of a block, as reported, and of a page (the kernel writes a page's part or nothing)
    block = max(small_fs.path.stat().st_blksize, os.sysconf("SC_PAGE_SIZE"))
    path.write_text(MINE + "#" * (block - len(MINE) - 41) + "\n")
    before = path.read_bytes()
    small_fs.fill(leave=0)
    with pytest.raises(OSError):
        save(path)
    assert path.read_bytes() == before
    (small_fs.path / "filler").unlink()
    _nothing_beside(path)


def test_w_keeps_mode_comments_and_layout(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(MINE)
    path.chmod(0o640)
    save_server(path, ENTRY)
    assert path.read_text().startswith(MINE) and _mode(path) == 0o640
    save_engine_knobs(path, {"staging_threads": 8, "h2d_chunk_bytes": 4 << 20})
    text = path.read_text()
    assert text.startswith(MINE.replace("staging_threads = 4", "staging_threads = 8") + "h2d_chunk_bytes = 4194304\n")
    assert _mode(path) == 0o640 and load_config(path).servers[0].name == "llamacpp-77"
    _nothing_beside(path)


def test_saving_knobs_edits_the_users_file_in_place(tmp_path: Path) -> None:
    """The knob form's save keeps every comment and the order of tables and keys (it rewrote the file with
    tomli_w and dropped them)."""
    path = tmp_path / "config.toml"
    mine = ('# top\n[engine]\n# why four\nstaging_threads = 4  # measured\nd2h_chunk_bytes = "4MiB"\n\n'
            '[sampling]  # after engine\ninterval_s = 2.0\n')
    path.write_text(mine)
    save_engine_knobs(path, {"d2h_chunk_bytes": 8 << 20})
    assert path.read_text() == mine.replace('"4MiB"', str(8 << 20))
    new = tmp_path / "new" / "config.toml"
    save_engine_knobs(new, {"staging_threads": 2})
    assert tomllib.loads(new.read_text()) == {"engine": {"staging_threads": 2}} and _mode(new) == 0o600


@pytest.mark.skipif(os.geteuid() != 0, reason="another user's file and root's writes need root (CI runs as root)")
def test_a_users_file_written_by_root_stays_the_users(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(MINE)
    os.chown(path, 65534, 65534)
    save_server(path, ENTRY)
    assert (path.stat().st_uid, path.stat().st_gid) == (65534, 65534)


@pytest.mark.parametrize("save", [lambda p: save_server(p, ENTRY), lambda p: save_engine_knobs(p, {"staging_threads": 8})],
                         ids=["W", "w"])
def test_a_planted_symlink_is_not_followed(tmp_path: Path, save) -> None:
    """A config dir others can write (0777): another user replaced config.toml by a link to a root-only file."""
    victim = tmp_path / "shadow"
    victim.write_text("root:$6$secret:19000:0:99999:7:::\n")
    victim.chmod(0o600)
    confdir = tmp_path / "conf"
    confdir.mkdir()
    confdir.chmod(0o777)
    link = confdir / "config.toml"
    link.symlink_to(victim)
    with pytest.raises(ConfigError, match=r"config.toml: is a symlink \(to .*shadow\).*only a regular file"):
        save(link)
    assert victim.read_text() == "root:$6$secret:19000:0:99999:7:::\n" and _mode(victim) == 0o600
    assert link.is_symlink() and sorted(p.name for p in confdir.iterdir()) == ["config.toml"]


@pytest.mark.parametrize("save", [lambda p: save_server(p, ENTRY), lambda p: save_engine_knobs(p, {"staging_threads": 8})],
                         ids=["W", "w"])
def test_a_read_only_file_is_not_written_even_by_root(tmp_path: Path, save) -> None:
    path = tmp_path / "config.toml"
    path.write_text(MINE)
    path.chmod(0o444)
    with pytest.raises(ConfigError, match=r"is read-only \(mode 0444\); make it writable"):
        save(path)
    assert path.read_text() == MINE and _mode(path) == 0o444
    _nothing_beside(path)


@pytest.mark.parametrize("save", [lambda p: save_server(p, ENTRY), lambda p: save_engine_knobs(p, {"staging_threads": 8})],
                         ids=["W", "w"])
def test_a_fifo_is_refused_without_waiting(tmp_path: Path, save) -> None:
    path = tmp_path / "config.toml"
    os.mkfifo(path)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            save(path)
        except BaseException as err:  # noqa: BLE001 - what the save raised is what the test checks
            errors.append(err)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    if t.is_alive():  # blocked on the FIFO: let it go (open a writer) and fail
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail("the save blocked on a FIFO")
    (err,) = errors
    assert isinstance(err, ConfigError) and "is not a regular file" in str(err)
    assert stat.S_ISFIFO(path.lstat().st_mode)


@pytest.mark.parametrize("servers", ['servers = "x"\n', '[servers.x]\nname = "a"\n', "servers = [1, 2]\n"])
def test_servers_that_are_no_list_of_tables_are_one_sentence(tmp_path: Path, servers: str) -> None:
    path = tmp_path / "config.toml"
    path.write_text(servers)
    with pytest.raises(ConfigError) as err:
        save_server(path, ENTRY)
    assert len(err.value.problems) == 1 and "servers must be a list of [[servers]] tables" in str(err.value)
    assert path.read_text() == servers
