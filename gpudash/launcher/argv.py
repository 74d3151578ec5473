"""Server spec -> command line and environment, as pure functions over the spec's kind.

A kind turns its spec fields into `Option`s naming every spelling a flag has had across server releases
(llama.cpp renamed `--draft-max` to `--spec-draft-n-max`); given the flags a binary's `--help` lists, the
first spelling the binary supports is used, and a field whose flag the binary lacks raises `MissingFlag`.
Flags in a spec's `extra_args` are checked against the same help.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gpudash.config import ServerSpec
from gpudash.launcher.kinds import kind_of
from gpudash.launcher.kinds.base import MissingFlag, Option


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    env: dict[str, str]


def options_for(spec: ServerSpec, port: int, peers: Sequence[ServerSpec] = ()) -> list[Option]:
    """The options a spec asks for; `peers` are all configured servers (for the shared-GPU count)."""
    return kind_of(spec).options(spec, port, peers or [spec])


def render(options: Sequence[Option], supported: Collection[str] | None = None) -> list[str]:
    """Options as argv words; with `supported`, each uses the first spelling the binary has (else MissingFlag).

    Without `supported` (nothing known about the binary) optional options are left out.
    """
    words: list[str] = []
    for opt in options:
        spelling = opt.spellings[0]
        if supported is None and opt.optional:
            continue
        if supported is not None:
            have = [s for s in opt.spellings if s in supported]
            if not have:
                if opt.optional:
                    continue
                raise MissingFlag(opt)
            spelling = have[0]
        words.append(spelling)
        if opt.value is not None:
            words.append(opt.value)
    return words


def check_extra_args(spec: ServerSpec, supported: Collection[str]) -> None:
    """MissingFlag for the first flag in `extra_args` that the binary's help does not list.

    An argparse negation the help hides (vLLM's `--no-enable-x`) counts when its positive form is listed,
    and a short flag glued to its value (`-O3`) when the short flag is.
    """
    kind = kind_of(spec)
    for word in spec.extra_args:
        flag = kind.extra_flag(word)
        if flag is None or flag in supported:
            continue
        if flag.startswith("--no-") and "--" + flag[5:] in supported:
            continue
        if not flag.startswith("--") and flag[:2] in supported:
            continue
        raise MissingFlag(Option("extra_args", (flag,)))


def build_command(spec: ServerSpec, binary: str, port: int, peers: Sequence[ServerSpec] = (),
                  supported: Collection[str] | None = None) -> Command:
    """The full argv and extra environment for one server (CUDA_VISIBLE_DEVICES from `gpus`, plus what
    its kind adds). With `supported`, `extra_args` are checked against it too."""
    kind = kind_of(spec)
    if supported is not None:
        check_extra_args(spec, supported)
    argv = kind.head(spec, binary) + render(options_for(spec, port, peers), supported) + list(spec.extra_args)
    env = dict(spec.env)
    if spec.gpus:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpus)
    for k, v in kind.env(spec).items():
        env.setdefault(k, v)
    return Command(tuple(argv), env)
