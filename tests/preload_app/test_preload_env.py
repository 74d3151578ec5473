"""Finding libgpudash_preload.so and the environment that starts a process under it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpudash.preload import shm as P
from gpudash.engine.errors import EngineArgumentError


def test_a_missing_library_says_how_to_build_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(P.PRELOAD_LIB_ENV, str(tmp_path / "nope.so"))
    with pytest.raises(P.PreloadLibraryMissing, match="GPUDASH_PRELOAD_LIB=.*nope.so is not a file"):
        P.preload_library()
    monkeypatch.delenv(P.PRELOAD_LIB_ENV)
    monkeypatch.setattr(P.N, "_candidates", lambda *a: [tmp_path / "a" / P.PRELOAD_LIB_NAME])
    with pytest.raises(P.PreloadLibraryMissing, match=r"not found; build it with `pip install \.` or `cmake"):
        P.preload_library()


def test_the_newest_build_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    old, new = tmp_path / "old" / P.PRELOAD_LIB_NAME, tmp_path / "new" / P.PRELOAD_LIB_NAME
    for i, p in enumerate((old, new)):
        p.parent.mkdir()
        p.write_bytes(b"x")
        os.utime(p, (1000 + i, 1000 + i))
    monkeypatch.delenv(P.PRELOAD_LIB_ENV, raising=False)
    monkeypatch.setattr(P.N, "_candidates", lambda *a: [old, new])
    assert P.preload_library() == new.resolve()


def test_env_puts_the_library_first_once_and_keeps_the_rest(tmp_path: Path) -> None:
    lib = tmp_path / P.PRELOAD_LIB_NAME
    base = {"LD_PRELOAD": f"/x/libother.so /old/{P.PRELOAD_LIB_NAME}:/y/libthird.so", "PATH": "/bin"}
    env = P.preload_env(base, "big", {"staging_threads": 8, "direct_first": False, "h2d_chunk_bytes": 4_000_000},
                        library=lib)
    assert env["LD_PRELOAD"] == f"{lib}:/x/libother.so:/y/libthird.so"
    assert env[P.NAME_ENV] == "big" and env["PATH"] == "/bin"
    assert env[P.KNOBS_ENV] == "staging_threads=8,direct_first=0,h2d_chunk_bytes=4000000"
    assert base["LD_PRELOAD"].startswith("/x/")  # the caller's mapping is left alone
    bare = P.preload_env({P.KNOBS_ENV: "stale=1"}, "a", {}, library=lib)
    assert bare["LD_PRELOAD"] == str(lib) and P.KNOBS_ENV not in bare


def test_env_refuses_bad_knobs_naming_them(tmp_path: Path) -> None:
    with pytest.raises(EngineArgumentError, match="registration_cache_bytes does not apply to a preloaded"):
        P.preload_env({}, "a", {"registration_cache_bytes": 1}, library=tmp_path / "l.so")
    with pytest.raises(EngineArgumentError, match="outstanding=0 is out of range"):
        P.preload_env({}, "a", {"outstanding": 0}, library=tmp_path / "l.so")
    assert P.preload_knobs({"registration_cache_bytes": 1, "outstanding": 3}) == {"outstanding": 3}
