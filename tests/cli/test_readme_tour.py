"""The README's tour is what a newcomer types first: every command it names exists, and every option it
shows is one that command takes (`server wake NAME --level 1` was documented and refused)."""

from __future__ import annotations

import re
from pathlib import Path

import click

from gpudash.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def tour_spans() -> list[str]:
    """The commands of the tour table's first column, as typed (`\\|` read as `|`): a column lists commands
    with " / " between them, each the first code span of its part (the words after it say more)."""
    text = README.read_text(encoding="utf-8").split("## A short tour", 1)[1]
    rows = [ln for ln in text.splitlines() if ln.startswith("| `")]
    assert rows, "the README's tour table is gone"
    parts = [part for row in rows for part in re.split(r"(?<!\\)\|", row)[1].split(" / ")]
    return [re.findall(r"`([^`]+)`", part)[0].replace("\\|", "|") for part in parts]


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


def test_every_toml_example_in_the_readme_is_a_config_gpudash_loads(tmp_path: Path) -> None:
    """The [[servers]] examples (launched, and attached with `url`) are what a newcomer copies."""
    from gpudash.config import load_config

    blocks = re.findall(r"```toml\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 2
    for i, block in enumerate(blocks):
        path = tmp_path / f"example{i}.toml"
        path.write_text(block, encoding="utf-8")
        servers = load_config(path).servers
        assert servers, block
    attached = [s for b in range(len(blocks)) for s in load_config(tmp_path / f"example{b}.toml").servers
                if s.attached]
    assert attached and all(s.url and s.model is None for s in attached)  # the README shows how to attach


def test_the_attach_section_is_where_the_tour_and_config_show_send_a_newcomer() -> None:
    from gpudash.commands.config_cmd import servers_template

    text = README.read_text(encoding="utf-8")
    assert "\n## Watch a server gpudash did not start\n" in text
    rows = [row for row in text.splitlines() if row.startswith("| `gpudash launch` with a `[[servers]]` entry "
                                                                "that has a `url` |")]
    assert len(rows) == 1 and "`A` attaches" in rows[0] and "`W` writes" in rows[0]  # a found server's keys
    assert 'the README\'s "Watch a server gpudash did not start"' in " ".join(
        ln.removeprefix("# ") for ln in servers_template())
