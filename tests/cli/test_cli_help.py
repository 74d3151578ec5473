"""Top-level `gpudash --help`: every command with its whole one-line description, and still no textual."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from gpudash.cli import COMMANDS, main

REPO = Path(__file__).resolve().parents[2]


def _squeezed(text: str) -> str:
    return "".join(text.split())  # the help wraps lines (and hyphenated words) to the terminal's width


def test_help_shows_each_commands_whole_description() -> None:
    result = CliRunner().invoke(main, ["--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    listing = _squeezed(result.output.split("Commands:", 1)[1])
    assert "..." not in listing
    for name, target in COMMANDS.items():
        module, attr = target.split(":")
        doc = getattr(importlib.import_module(module), attr).help
        first = doc.split("\n\n")[0].split(". ")[0].rstrip(".")  # click's short help: the first sentence
        assert _squeezed(f"{name}{first}") in listing, name


def test_help_does_not_import_textual() -> None:
    script = ("import sys; from gpudash.cli import main\n"
              "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
              "print('textual' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Commands:" in proc.stdout and proc.stdout.splitlines()[-1] == "False"
