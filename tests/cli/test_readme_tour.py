"""The README's tour is what a newcomer types first: every command it names exists, and every option it
shows is one that command takes (`server wake NAME --level 1` was documented and refused)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from gpudash.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def tour_spans() -> list[str]:
    """The code spans of the tour table's first column, as typed (`\\|` read as `|`)."""
    text = README.read_text(encoding="utf-8").split("## A short tour", 1)[1]
    rows = [ln for ln in text.splitlines() if ln.startswith("| `")]
    assert rows, "the README's tour table is gone"
    firsts = [re.split(r"(?<!\\)\|", row)[1] for row in rows]
    return [span.replace("\\|", "|") for first in firsts for span in re.findall(r"`([^`]+)`", first)]


def commands_of(words: list[str], group: click.Group = main) -> list[tuple[click.Command, list[str]]]:
    """The commands the leading words name (`sleep|wake` names two), each with the words after them."""
    ctx = click.Context(group)
    found = []
    for name in words[0].split("|"):
        cmd = group.get_command(ctx, name)
        assert cmd is not None, f"the README names `{name}`, which is no command of `{group.name}`"
        if isinstance(cmd, click.Group) and len(words) > 1 and not words[1].startswith(("-", "[")):
            found += commands_of(words[1:], cmd)
        else:
            found.append((cmd, words[1:]))
    return found


def test_every_option_in_the_tour_is_one_its_command_takes() -> None:
    checked = 0
    for span in tour_spans():
        words = span.removeprefix("gpudash ").split()
        for cmd, rest in commands_of(words):
            taken = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
            for option in re.findall(r"--[a-z][a-z0-9-]*", " ".join(rest)):
                assert option in taken, f"README: `{span}`: `{cmd.name}` takes no {option}"
                checked += 1
    assert checked >= 15  # the tour shows options, and this test read them
