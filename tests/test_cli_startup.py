"""`gpudash --help` lists every command's first sentence without importing the commands (read from their
sources), so it costs about what `--version` does; and the exit codes the README documents hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from gpudash.cli import COMMANDS

REPO = Path(__file__).resolve().parent.parent

LISTING = """\
import importlib, json, sys
from click.testing import CliRunner
from gpudash.cli import COMMANDS, main
if sys.argv[1] == "imported":
    for target in COMMANDS.values():
        importlib.import_module(target.split(":")[0])
before = set(sys.modules)
out = CliRunner().invoke(main, ["--help"], terminal_width=100).output
print(json.dumps({"help": out, "imported": sorted(m for m in set(sys.modules) - before if m.startswith("gpudash"))}))
"""


def _listing(how: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", LISTING, how], capture_output=True, text=True, env=env, cwd=REPO,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_help_reads_first_sentences_without_importing_any_command() -> None:
    lazy, imported = _listing("lazy"), _listing("imported")
    assert lazy["help"] == imported["help"]  # the same words as click makes from the imported commands
    commands = {target.split(":")[0] for target in COMMANDS.values()}
    assert not commands & set(lazy["imported"]), lazy["imported"]
    assert "launch" in lazy["help"] and "Open the live dashboard" in lazy["help"]


def test_a_hidden_or_helpless_command_is_read_as_click_would(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "fake_cmds.py").write_text(
        "import click\n\n@click.command(short_help='Short one.')\ndef a():\n    'Long text. More.'\n\n"
        "@click.command(hidden=True)\ndef b():\n    'Hidden.'\n\n"
        "@click.command(help='From the decorator. Second.')\n@click.option('--x', help='Not this.')\ndef c(x):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from gpudash.commands.groups import LazyGroup

    group = LazyGroup("g", lazy={"a": "fake_cmds:a", "b": "fake_cmds:b", "c": "fake_cmds:c"})
    out = CliRunner().invoke(group, ["--help"]).output
    assert "fake_cmds" not in sys.modules
    assert "Short one." in out and "Hidden" not in out and "From the decorator" in out and "Not this" not in out


def test_exit_codes_as_documented(tmp_path: Path) -> None:
    """2 for a usage error, 1 for a runtime failure, the program's own code for `run`."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_CONFIG_HOME": str(tmp_path / "c"),
           "XDG_DATA_HOME": str(tmp_path / "d"), "XDG_CACHE_HOME": str(tmp_path / "k"),
           "XDG_STATE_HOME": str(tmp_path / "s")}

    def code(*args: str) -> int:
        return subprocess.run([sys.executable, "-m", "gpudash", *args], capture_output=True, env=env, cwd=tmp_path,
                              timeout=120).returncode

    assert code("status", "--no-such-option") == 2
    assert code("fleet", "--prometheus", "http://127.0.0.1:9") == 1  # nothing listens there
    assert code("run", "--", sys.executable, "-c", "raise SystemExit(7)") == 7


def test_shell_completion_lists_the_commands(tmp_path: Path) -> None:
    """The README's completion line works with the lazily imported commands."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "_GPUDASH_COMPLETE": "bash_complete", "COMP_WORDS": "gpudash de",
           "COMP_CWORD": "1"}
    r = subprocess.run([sys.executable, "-c", "from gpudash.cli import main; main(prog_name='gpudash')"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert {"plain,demo-model", "plain,deploy"} <= set(r.stdout.split())
