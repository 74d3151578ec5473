"""What the config cannot know about the box, the supervisor checks before anything starts: a server's
GPUs must exist, and its tensor split must have one ratio per GPU it runs on (the start and a split
change through the controller are both refused in one sentence, the running server untouched)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudash.config import ServerSpec
from gpudash.launcher.errors import LaunchError
from gpudash.launcher.supervisor import Supervisor
from gpudash.telemetry.inbox import Inbox

GIB = 2**30


def _sup(tmp_path: Path, spec: ServerSpec, gpus: dict[int, int] | None) -> Supervisor:
    return Supervisor([spec], Inbox(), tmp_path / "logs", gpu_memory=(lambda: gpus) if gpus is not None else None)


def test_a_gpu_the_box_lacks_is_refused_before_start(tmp_path: Path) -> None:
    spec = ServerSpec(name="big", kind="llama.cpp", model=str(tmp_path / "m.gguf"), gpus=[0, 5])
    with pytest.raises(LaunchError, match=r"`gpus` names GPU 5 but this box has GPU 0, 1; fix `gpus`"):
        _sup(tmp_path, spec, {0: 16 * GIB, 1: 24 * GIB}).start("big")


def test_a_split_longer_than_the_boxs_gpus_is_refused(tmp_path: Path) -> None:
    """With `gpus` unset the server runs on every GPU, which only the box knows (the config refuses a
    split longer than a `gpus` list itself)."""
    spec = ServerSpec(name="big", kind="llama.cpp", model=str(tmp_path / "m.gguf"), tensor_split=[1, 1, 1])
    with pytest.raises(LaunchError, match=r"big runs on 2 GPUs \(0,1\): give 2 ratios, not 3"):
        _sup(tmp_path, spec, {0: 16 * GIB, 1: 24 * GIB}).start("big")


def test_unknown_gpus_are_not_guessed(tmp_path: Path) -> None:
    """Where the supervisor is not told the GPUs (a sim rig), only the model check speaks."""
    spec = ServerSpec(name="big", kind="llama.cpp", model=str(tmp_path / "m.gguf"), gpus=[7])
    with pytest.raises(LaunchError, match="model file .* does not exist"):
        _sup(tmp_path, spec, {}).start("big")
