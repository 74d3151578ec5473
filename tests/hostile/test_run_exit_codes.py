"""`gpudash run -- CMD` exits as a shell does when CMD cannot start: 127 for a command that is not there, 126
for a file that is not executable (or not a program), each with one line on stderr. The real CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from hostile_helpers import gpudash


def _not_executable(tmp: Path) -> Path:
    path = tmp / "script.sh"
    path.write_text("#!/bin/sh\necho hi\n")
    path.chmod(0o644)
    return path


def _not_a_program(tmp: Path) -> Path:
    path = tmp / "data.bin"
    path.write_bytes(b"\x00\x01 not an executable format")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("make, code, said", [
    (lambda tmp: Path("/nonexistent_prog"), 127, "No such file or directory"),
    (lambda tmp: tmp / "missing" / "prog", 127, "No such file or directory"),
    (_not_executable, 126, "Permission denied"),
    (_not_a_program, 126, "Exec format error"),
    (lambda tmp: tmp, 126, "Permission denied"),  # a directory
])
def test_a_command_that_cannot_start_exits_as_a_shell_does(tmp_path: Path, make, code: int, said: str) -> None:
    r = gpudash("run", "--", str(make(tmp_path)), home=tmp_path)
    assert r.returncode == code, r.stderr
    assert said in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
