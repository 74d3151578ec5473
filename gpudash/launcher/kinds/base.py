"""The contract every server kind fulfils, so that a new kind is one module plus one registry line.

A kind (llama.cpp's llama-server, vLLM, ...) owns everything that differs between servers: the config
fields it accepts (`spec_class`, a pydantic model that subclasses ServerSpec and validates them), its
command line and how its `--help` is read, how its /metrics become ServerSample fields, health and what
else it reads (KV slots), sleep and wake, how a memory share becomes flags, the process command line that
discovery recognises, and the /metrics families that tell an attached server's kind. Everything outside
`gpudash/launcher/kinds/` asks the kind (`kinds.kind_of(spec)`) and never compares kind names.

Methods with a body are what most kinds do; a kind overrides those that differ (harlequin's adapter
contract is the model: one abstract class, options declared by the adapter).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from gpudash.config import ServerSpec
from gpudash.launcher.counters import Prev, parse_metrics
from gpudash.launcher.scrape_http import ScrapeError


@dataclass(frozen=True)
class Option:
    """One flag a spec asks for: the spec field behind it, the flag's spellings (preferred first), its value."""

    field: str
    spellings: tuple[str, ...]
    value: str | None = None
    optional: bool = False  # used only when the binary's help lists it (a nicety, not something asked for)


class MissingFlag(Exception):
    """The binary supports none of an option's spellings."""

    def __init__(self, option: Option):
        super().__init__(option.spellings[0])
        self.option = option


@dataclass(frozen=True)
class Budget:
    """Flags a kind chose so a server stays inside its memory share, and what it expects to hold."""

    argv: tuple[str, ...]
    note: str


class ServerKind(ABC):
    """One kind of inference server. Instances hold no state: the registry keeps one of each."""

    name: ClassVar[str]
    """The `kind` a [[servers]] entry names."""

    label: ClassVar[str]
    """What operators call its program, in messages ("llama-server")."""

    spec_class: ClassVar[type[ServerSpec]]
    """Its [[servers]] model: ServerSpec plus the kind's own fields and their checks."""

    default_port: ClassVar[int]
    """The port it listens on when its command line names none (discovery)."""

    metric_prefix: ClassVar[str]
    """The prefix of its /metrics families ("llamacpp:"); an attached server's kind is told by it."""

    models_owner: ClassVar[str]
    """The `owned_by` its /v1/models entries carry (tells its kind when /metrics cannot)."""

    sleep_levels: ClassVar[tuple[int, ...]] = ()
    """Sleep levels it serves (none: it cannot sleep)."""

    runs_llama_build: ClassVar[bool] = False
    """It runs a llama-server that gpudash picks or builds (`gpudash llama build`): doctor reads that build,
    and on NVIDIA GPUs gpudash compiles a CUDA one for it."""

    eager_field: ClassVar[str | None] = None
    """Its [[servers]] field that turns CUDA graphs off (vLLM's enforce_eager), if it has one: graphs reserve
    memory on each card, so doctor warns when several such servers crowd a GPU and one keeps them."""

    own_series: ClassVar[Mapping[str, str]] = {}
    """The ServerSample fields that copy a series the server exports itself (field -> that family): gpudash's
    Prometheus exposition leaves them out unless `[prometheus] servers = "all"`, so nothing is exported twice."""

    def nccl_ranks(self, spec: ServerSpec) -> int:
        """The GPUs it spreads one model over through NCCL (tensor parallelism); 1 for none."""
        return 1


    # ---- launching ---------------------------------------------------------------------------------

    @abstractmethod
    def find_binary(self, spec: ServerSpec) -> str:
        """Its executable when the spec names none; LaunchError saying where it looked and the fix."""

    def binary_origin(self, binary: str) -> str:
        """Where find_binary found `binary`, in the words doctor prints."""
        return "PATH"

    @abstractmethod
    def help_commands(self, binary: str) -> list[list[str]]:
        """Invocations whose output lists the flags, tried in order."""

    def head(self, spec: ServerSpec, binary: str) -> list[str]:
        """argv before the options (the program, a subcommand, a positional model)."""
        return [binary]

    @abstractmethod
    def options(self, spec: ServerSpec, port: int, peers: Sequence[ServerSpec]) -> list[Option]:
        """The options a spec asks for; `peers` are every configured server (for shared-GPU rules)."""

    def env(self, spec: ServerSpec) -> dict[str, str]:
        """Environment the kind adds for a spec (beyond `env` and CUDA_VISIBLE_DEVICES)."""
        return {}

    def extra_flag(self, word: str) -> str | None:
        """The flag an `extra_args` word names as --help lists it (`--x=1` names `--x`), None for a value."""
        if not word.startswith("-") or word == "-" or word[1:2].isdigit() or word[1:2] == ".":
            return None
        return word.split("=", 1)[0]

    def model_files(self, spec: ServerSpec) -> list[tuple[str, str]]:
        """(field, path) of files that must exist before a launch."""
        return []

    def model_file(self, spec: ServerSpec) -> Path | None:
        """The one file holding a spec's weights, when the kind serves a single file (the split planner)."""
        return None

    def fitted(self, spec: ServerSpec, gpu_totals: dict[int, int]) -> tuple[ServerSpec, Budget | None]:
        """The spec to run inside its share of `gpu_totals` ({GPU: bytes}); ValueError when it cannot be.
        Kinds that enforce a share themselves run the spec as it is."""
        return spec, None

    def ready_note(self, base_url: str) -> str | None:
        """A short fact for the server.ready event (a build id), or None."""
        return None

    def flag_for(self, setting: str) -> str | None:
        """The flag an operator changes on the server's own command line for a setting ("split", "share",
        or a spec field), for the sentence that refuses it on an attached server; None when it has none."""
        return None

    # ---- shares and splits -------------------------------------------------------------------------

    def at_share(self, spec: ServerSpec, share: float, gpu_totals: dict[int, int]) -> tuple[ServerSpec, str]:
        """The spec relaunched at another share of the GPUs in `gpu_totals` ({}: none), and the flags that
        carry it (`gpudash bench share` prints them)."""
        new, budget = self.fitted(spec.model_copy(update={"share": share}), gpu_totals)
        return new, " ".join(budget.argv) if budget is not None else ""

    # ---- watching ----------------------------------------------------------------------------------

    @abstractmethod
    def fields(self, m: dict[str, float], prev: Prev | None, pid: int | None, now: float) -> dict[str, Any]:
        """ServerSample fields from its parsed /metrics and the previous scrape of the same process."""

    def read_metrics(self, get: Callable[[str], tuple[int, bytes]]) -> dict[str, float]:
        """GET /metrics, parsed (ScrapeError when it does not answer 200, ValueError when it is not
        Prometheus text)."""
        status, body = get("/metrics")
        if status != 200:
            raise ScrapeError(f"GET /metrics answered HTTP {status}")
        return parse_metrics(body.decode("utf-8", "replace"))

    def scrape(self, get: Callable[[str], tuple[int, bytes]], spec: ServerSpec | None, prev: Prev | None,
               pid: int | None, now: float) -> tuple[dict[str, Any], dict[str, float]]:
        """One tick's read of a server through `get(path) -> (status, body)`: its ServerSample fields, and
        the values the next tick's rates are measured against."""
        m = self.read_metrics(get)
        return self.fields(m, prev, pid, now), m

    def sleep_problem(self, spec: ServerSpec, level: int | None = None) -> str | None:
        """Why the server cannot be put to sleep (at `level`), or None when it can."""
        return f"{self.label} has no sleep mode"

    def sleep(self, base_url: str, level: int) -> Any:
        """Put the server to sleep at `level` (SleepResult); SleepError when it refuses."""
        raise NotImplementedError(f"{self.label} has no sleep mode")

    def wake(self, base_url: str) -> Any:
        """Wake a sleeping server (SleepResult); SleepError when it refuses."""
        raise NotImplementedError(f"{self.label} has no sleep mode")

    # ---- discovery and attach ----------------------------------------------------------------------

    @abstractmethod
    def matches(self, cmdline: Sequence[str]) -> bool:
        """Whether a process command line runs this kind of server."""

    def address(self, cmdline: Sequence[str]) -> tuple[str, int]:
        """(host, port) a matching command line listens on: its --host/--port, else the defaults."""
        host, port = "127.0.0.1", self.default_port
        words = list(cmdline)
        for i, w in enumerate(words):
            flag, eq, val = w.partition("=")
            if not eq and i + 1 < len(words):
                val = words[i + 1]
            if flag == "--host" and val:
                host = val
            elif flag == "--port" and val.isdigit():
                port = int(val)
        return host, port

    def recognises(self, families: set[str]) -> bool:
        """Whether /metrics family names are this kind's."""
        return any(f.startswith(self.metric_prefix) for f in families)


def program_name(cmdline: Sequence[str]) -> str:
    """The file name of a command line's program ("" for an empty one)."""
    return os.path.basename(cmdline[0]) if cmdline else ""
