"""No two files of csrc/preload/ depend on each other: each file's object uses the symbols that others
define in one direction only (the process state lives in state.c, which uses none of theirs). Read from
the objects' symbol tables (nm), so a call or a variable that crosses back is caught however it is spelt."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import fakebuild


def symbols(obj: Path) -> tuple[set[str], set[str]]:
    """(defined global symbols, undefined symbols) of one object file."""
    nm = shutil.which("nm")
    if nm is None:
        pytest.fail("nm (binutils) is needed to read the preload's object files; install binutils")
    out = subprocess.run([nm, "-P", str(obj)], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        name, kind = line.split()[:2]
        if kind == "U":
            undefined.add(name)
        elif kind.isupper():
            defined.add(name)
    return defined, undefined


def uses(objects: list[Path]) -> dict[str, dict[str, set[str]]]:
    """uses[a][b]: the symbols file a takes from file b."""
    table = {o.stem: symbols(o) for o in objects}
    return {a: {b: und & table[b][0] for b in table if b != a and und & table[b][0]}
            for a, (_, und) in table.items()}


def reach(graph: dict[str, dict[str, set[str]]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for b in graph[todo.pop()]:
            if b not in seen:
                seen.add(b)
                todo.append(b)
    return seen


def how(graph: dict[str, dict[str, set[str]]], a: str, b: str) -> str:
    """How file a depends on file b, for the failure message."""
    return f"{a} uses {sorted(graph[a][b])} of {b}" if b in graph[a] else f"{a} reaches {b} through other files"


def test_no_two_preload_files_depend_on_each_other(tmp_path: Path) -> None:
    objects = fakebuild.build_preload_objects(tmp_path)
    graph = uses(objects)
    assert len(graph) == len(list((fakebuild.REPO / "csrc" / "preload").glob("*.c"))) >= 5
    assert graph["doors"]["carry"] >= {"gp_take"}  # the reading sees real uses
    loops = sorted((a, b) for a in graph for b in reach(graph, a) if a < b and a in reach(graph, b))
    detail = "; ".join(f"{how(graph, a, b)}, {how(graph, b, a)}" for a, b in loops)
    assert not loops, f"files of csrc/preload/ depend on each other (directly or through others): {detail}"
    assert graph["state"] == {}, f"state.c uses other files' symbols: {graph['state']}"
