"""The C++ backend interface stays narrow (Mooncake's transport.h is the model): Backend declares what both
data planes do, the sim's own controls live in SimControls (backend_sim.hpp), and the shared Path and Copy
carry no medium's state (each backend keeps its own). Read from the sources; the sim engine tests
exercise the same calls through the C ABI."""

from __future__ import annotations

import re
from pathlib import Path

CSRC = Path(__file__).resolve().parents[2] / "csrc"


def _body(text: str, head: str) -> str:
    """The text between `head`'s opening brace and its matching `};`."""
    start = text.index(head)
    depth, i = 0, text.index("{", start)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    raise AssertionError(f"no end to {head}")


def _words(code: str) -> set[str]:
    code = re.sub(r"//[^\n]*", "", code)
    return set(re.findall(r"[A-Za-z_]\w*", code))


def test_backend_declares_no_sim_only_call() -> None:
    core = (CSRC / "engine_core.hpp").read_text(encoding="utf-8")
    backend = _words(_body(core, "class Backend {"))
    assert {"issue", "complete", "prepare_path", "alloc_device", "classify", "stream_begin"} <= backend
    assert not backend & {"is_sim", "set_link", "track", "untrack", "fail_path", "inject_fail"}
    controls = _words(_body((CSRC / "backend_sim.hpp").read_text(encoding="utf-8"), "class SimControls {"))
    assert {"set_link", "track", "untrack", "fail_path"} <= controls


def test_path_and_copy_carry_no_medium_state() -> None:
    core = (CSRC / "engine_core.hpp").read_text(encoding="utf-8")
    for shared in ("struct Path {", "struct Copy {"):
        names = _words(_body(core, shared))
        assert not {w for w in names if w.lower().startswith(("sim", "cuda"))}, shared
    cuda = (CSRC / "backend_cuda.cpp").read_text(encoding="utf-8")
    assert "struct StreamOrder final : CopyState" in cuda and "std::deque<PathState> paths_" in cuda
    assert "std::deque<std::atomic<bool>> fail_" in (CSRC / "backend_sim.cpp").read_text(encoding="utf-8")
