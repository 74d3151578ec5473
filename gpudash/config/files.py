"""Where the config file is and reading it as TOML, without the settings model: `gpudash run` reads its
[engine] table from here before it starts its program, and `load_config` reads the whole file the same way
before validating it. Light on purpose: tomllib and platformdirs only, no pydantic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpudash import APP_NAME


class ConfigError(Exception):
    """A config file that cannot be used; `problems` holds one human line per problem."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def _config_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_config_dir(APP_NAME))


def default_config_path() -> Path:
    """The user config file gpudash reads when --config is not given."""
    return _config_dir() / "config.toml"


def tuned_dir() -> Path:
    """Where `gpudash bench engine --tune` keeps the knobs tuned on this machine (gpudash/runtime/tuned.py)."""
    return _config_dir() / "tuned"


def any_tuned() -> bool:
    """Whether any machine's tuned knobs are kept here: without one, nobody needs to ask NVML who this is."""
    return tuned_dir().is_dir() and any(tuned_dir().glob("engine-*.toml"))


def read_config_file(path: Path | str | None = None) -> tuple[Path, dict[str, Any] | None]:
    """(the file, its parsed TOML): `path` if given (must exist), else the user config file; None for the
    data where no user config file exists. ConfigError in one sentence for a file that cannot be read."""
    explicit = path is not None
    p = Path(path).expanduser() if explicit else default_config_path()
    if not p.exists():
        if explicit:
            raise ConfigError([f"{p}: file not found; pass an existing TOML file to --config"])
        return p, None
    if not p.is_file():  # a FIFO or device would block the read or never end
        raise ConfigError([f"{p}: not a regular file; pass a TOML file to --config"])
    import tomllib

    try:
        return p, tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as err:
        raise ConfigError([f"{p}: not valid TOML: {err}"]) from None
    except RecursionError:
        raise ConfigError([f"{p}: nested too deeply to be a gpudash config; flatten its tables"]) from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError([f"{p}: cannot be read: {err}"]) from None
