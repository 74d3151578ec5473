"""Fixtures of the hostile suite: a misbehaving OpenAI-compatible server, and a small real filesystem.

The full disk and the read-only filesystem are a small ext2 image loop-mounted (needs root and a loop
device; CI runs these tests as root). Without them those tests skip and say why, except in CI
(GPUDASH_REQUIRE_LOOP_MOUNT=1, set by .ci/run), where they fail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostile_helpers import Mount
from hostile_server import HostileServer


@pytest.fixture
def hostile() -> Iterator[HostileServer]:
    srv = HostileServer().start()
    yield srv
    srv.close()


def _cannot_mount(why: str) -> None:
    """Skip where a loop mount is impossible, except in CI (GPUDASH_REQUIRE_LOOP_MOUNT=1), where the
    disk-fault tests must run: a skip there would hide them."""
    if os.environ.get("GPUDASH_REQUIRE_LOOP_MOUNT") == "1":
        pytest.fail(f"GPUDASH_REQUIRE_LOOP_MOUNT=1 but {why}")
    pytest.skip(why)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Mount]:
    """An 8 MiB ext2 filesystem of its own (no reserved blocks), mounted for the test."""
    if os.geteuid() != 0:
        _cannot_mount("loop-mounting a small filesystem needs root (CI runs this suite as root)")
    try:
        m = Mount(tmp_path, 8 << 20)
    except OSError as err:
        _cannot_mount(f"cannot loop-mount a small filesystem here: {err}")
    yield m
    m.unmount()


@pytest.fixture
def other_user() -> Iterator[tuple[str, int, int]]:
    """A throwaway local user (name, uid, gid), removed at the end: another account on a shared box.
    Needs root (CI runs this suite as root); skips otherwise, except where GPUDASH_REQUIRE_LOOP_MOUNT=1."""
    import secrets
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("useradd") is None:
        _cannot_mount("a second user needs root and useradd (CI runs this suite as root)")
    name = f"gpdh{secrets.token_hex(4)}"
    subprocess.run(["useradd", "-M", "-N", "-s", "/usr/sbin/nologin", name], check=True, capture_output=True)
    try:
        import pwd

        entry = pwd.getpwnam(name)
        yield name, entry.pw_uid, entry.pw_gid
    finally:
        subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory like /tmp (1777), which every user can write: where the second user plants things."""
    import shutil
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="gpudash-shared-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)
