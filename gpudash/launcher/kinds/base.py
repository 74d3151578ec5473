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
from gpudash.launcher.counters import History, Prev, parse_metrics, speaks
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

    metric_families: ClassVar[frozenset[str]]
    """The /metrics families it reads (names, or a prefix ending in ':'): only those are parsed."""

    models_owner: ClassVar[str]
    """The `owned_by` its /v1/models entries carry (tells its kind when /metrics cannot)."""

    api_key_env: ClassVar[str | None] = None
    """The environment variable its server takes an API key from besides `--api-key` (None: none)."""

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

    def api_key(self, spec: ServerSpec) -> str | None:
        """The API key a launched server was started with (`--api-key KEY` or `--api-key=KEY` in its
        extra_args, else its kind's variable in its env), which gpudash's own requests to it must carry."""
        words = list(spec.extra_args)
        for i, w in enumerate(words):
            flag, eq, value = w.partition("=")
            if flag == "--api-key":
                key = value if eq else (words[i + 1] if i + 1 < len(words) else "")
                return key.strip() or None
        key = spec.env.get(self.api_key_env or "", "").strip() if self.api_key_env else ""
        return key or None

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
    def fields(self, m: dict[str, float], prev: Prev | None, pid: int | None, now: float,
               base: Prev | None = None) -> dict[str, Any]:
        """ServerSample fields from its parsed /metrics, the previous scrape of the same process (rates) and
        the first of the last minute's scrapes (`base`: windowed figures; None: `prev`)."""

    def read_metrics(self, get: Callable[[str], tuple[int, bytes]]) -> dict[str, float]:
        """GET /metrics, parsed (its families this kind reads only; ScrapeError when it does not answer 200,
        ValueError when it is not Prometheus text)."""
        status, body = get("/metrics")
        if status != 200:
            raise ScrapeError(f"GET /metrics answered HTTP {status}")
        return parse_metrics(body.decode("utf-8", "replace"), self.metric_families)

    def scrape(self, get: Callable[[str], tuple[int, bytes]], spec: ServerSpec | None, history: History,
               pid: int | None, now: float, cmdline: Sequence[str] | None = None
               ) -> tuple[dict[str, Any], dict[str, float]]:
        """One tick's read of a server through `get(path) -> (status, body)`: its ServerSample fields, and
        the values later ticks' rates are measured against (the caller adds them to `history`). `cmdline`:
        the server's command line when it runs on this machine (an attached server found here)."""
        m = self.read_metrics(get)
        return self.fields(m, history.last, pid, now, history.start), m

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

    def recognises(self, metrics_text: str) -> bool:
        """Whether a /metrics answer has this kind's families (a scan for the prefix, no parse)."""
        return speaks(metrics_text, self.metric_prefix)


def program_name(cmdline: Sequence[str]) -> str:
    """The file name of a command line's program ("" for an empty one)."""
    return os.path.basename(cmdline[0]) if cmdline else ""
