"""Engine knobs tuned on this machine: `gpudash bench engine --tune` stores what it measured in one file
per machine (hostname, GPU names and UUIDs, driver version), and every command uses those values for
the [engine] knobs its config file leaves unset, so a newcomer's first run gets the tuned figures.
`gpudash config show` says of each knob where its value came from. The file is written atomically and read
without following a link or waiting on a FIFO (private_fs)."""

from __future__ import annotations

import hashlib
import socket
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from gpudash.config import Config, ConfigError, EngineSettings, validate
from gpudash.config.files import any_tuned, tuned_dir
from gpudash.private_fs import private_dir, read_capped, write_atomic

TUNED_FILE_CAP = 64 << 10  # bytes: a tuned file is a few hundred; anything larger is not one gpudash wrote


def machine_identity() -> str:
    """What a tuning result holds for: this host, its GPUs (name and UUID, in NVML order) and driver."""
    from gpudash.gpu import nvml
    from gpudash.gpu.device import devices

    host = socket.gethostname()
    if nvml.driver_available() is not None:
        return f"{host}; no NVIDIA GPU"
    gpus = ", ".join(f"{d.static.name} {d.static.uuid}" for d in devices())
    return f"{host}; driver {nvml.driver_version()}; {gpus}"


def tuned_path(identity: str) -> Path:
    """The file holding `identity`'s tuned knobs (named by a digest of it; the file also says it in full)."""
    return tuned_dir() / f"engine-{hashlib.sha256(identity.encode()).hexdigest()[:16]}.toml"


def save_tuned(knobs: dict[str, int], identity: str | None = None) -> Path:
    """Store `knobs` (merged over what this machine had) for this machine, validated first so a bad result
    never reaches the file; returns the file."""
    identity = identity or machine_identity()
    path = tuned_path(identity)
    old = _read(path, identity) if path.exists() else {}
    merged = {**old, **knobs}
    validate({"engine": merged}, str(path))
    private_dir(path.parent)
    return write_atomic(path, tomli_w.dumps({"machine": identity, "engine": merged}))


def _read(path: Path, identity: str) -> dict[str, Any]:
    try:
        data = tomllib.loads(read_capped(path, TUNED_FILE_CAP).decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise ConfigError([f"{path}: cannot be read: {err}; delete it or run `gpudash bench engine --tune` "
                           f"again"]) from None
    if data.get("machine") != identity:  # a digest collision, or a file copied from another machine
        return {}
    engine = data.get("engine", {})
    validate({"engine": engine}, str(path))
    return dict(engine)


def load_tuned(identity: str | None = None) -> tuple[Path, dict[str, Any]] | None:
    """(file, knobs) tuned on this machine, or None. Without any tuned file NVML is not even asked."""
    if not any_tuned():
        return None
    identity = identity or machine_identity()
    path = tuned_path(identity)
    if not path.is_file():
        return None
    knobs = _read(path, identity)
    return (path, knobs) if knobs else None


def with_tuned(config: Config, identity: str | None = None) -> Config:
    """`config` with this machine's tuned knobs in every [engine] knob the config file left unset."""
    found = load_tuned(identity)
    if found is None:
        return config
    path, knobs = found
    apply = {k: v for k, v in knobs.items() if k not in config.engine.model_fields_set}
    if not apply:
        return config
    engine = EngineSettings.model_validate({**config.engine.model_dump(include=config.engine.model_fields_set),
                                            **apply})
    engine.mark_tuned(path, apply)
    return config.model_copy(update={"engine": engine})
