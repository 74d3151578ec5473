"""The engine's exceptions: one for failures, one for bad arguments (also a ValueError)."""

from __future__ import annotations


class EngineError(RuntimeError):
    """A copy or engine call failed; `code` is the engine's code, `name` its symbolic name
    (a CUDA error name such as ``CUDA_ERROR_INVALID_VALUE`` when the driver refused)."""

    def __init__(self, message: str, code: int = 0, name: str = ""):
        super().__init__(message)
        self.code = code
        self.name = name


class EngineArgumentError(EngineError, ValueError):
    """A bad argument or knob value; the message names it and the accepted range. Nothing was done."""
