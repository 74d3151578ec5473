"""`gpudash demo-model OUT` writes into a folder that exists: a missing folder or a file on the way is refused
in one sentence that names it, and nothing is created (it made /nonexistent/dir as root before)."""

from __future__ import annotations

from pathlib import Path

from cli_helpers import run


def test_a_missing_folder_is_refused_and_not_created(tmp_path: Path) -> None:
    out = tmp_path / "no" / "such" / "x.gguf"
    r = run(tmp_path, "demo-model", str(out))
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr == (f"gpudash: cannot write {out}: the folder {out.parent} does not exist; create it first "
                        f"(mkdir -p {out.parent}) or pick a path in a folder that exists\n")
    assert not (tmp_path / "no").exists()


def test_a_file_on_the_way_is_named_as_a_file(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine\n")
    for out in (tmp_path / "notes.txt" / "x.gguf", tmp_path / "notes.txt" / "deeper" / "x.gguf"):
        r = run(tmp_path, "demo-model", str(out))
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert r.stderr == (f"gpudash: cannot write {out}: {tmp_path / 'notes.txt'} is a file, not a folder; "
                            "pick a path in a folder\n")
    assert (tmp_path / "notes.txt").read_text() == "mine\n"


def test_a_folder_that_exists_is_written_into(tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    r = run(tmp_path, "demo-model", str(out), "--layers", "1")
    assert r.returncode == 0, r.stderr
    assert out.stat().st_size > 0 and f"wrote {out}" in r.stdout
