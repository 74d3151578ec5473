"""No import circle inside gpudash: every import counts, at the top of a module, inside a function or under
TYPE_CHECKING, since each one ties the two modules together. The frozen records (and the labels beneath
them) are the ground floor and import nothing above them; the rig sits above the telemetry sources it builds.

The graph is read from the source with ast, so a circle fails here even where lazy imports would hide it
at run time. An import runs the parent packages' __init__ too (`import a.b.c` runs a/__init__ and
a/b/__init__), so it ties the importer to those as well, unless the importer is inside that package (its
own parents have run already). That is how a package __init__ that imports its submodules closes a circle
through a module outside it: shares -> launcher.kinds.spec ran launcher/kinds/__init__, which imported
kinds.llama_cpp, which imported shares (`python -c "import gpudash.shares"` failed that way)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "gpudash"


def module_files() -> dict[str, Path]:
    """{dotted module name: file} for every module of gpudash (a package is its __init__.py)."""
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _owner(name: str, modules: dict[str, Path]) -> str | None:
    """The gpudash module that an imported dotted name lives in (the name itself, or its closest parent)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _with_parents(module: str, target: str, modules: dict[str, Path]) -> set[str]:
    """`target` and each package above it whose __init__ importing it runs, less `module`'s own parents."""
    own = {module.rsplit(".", n)[0] for n in range(1, module.count(".") + 1)}
    parts = target.split(".")
    chain = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return {m for m in chain if m in modules and m not in own}


def imports_of(module: str, modules: dict[str, Path]) -> set[str]:
    """The gpudash modules `module` imports anywhere in its file (`from pkg import submodule` counts the
    submodule, `from pkg import name` the package), with the parent packages each import runs."""
    path = modules[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(filter(None, (_owner(a.name, modules) for a in node.names)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                owner = full if full in modules else _owner(base, modules)
                if owner:
                    out.add(owner)
    out = set().union(*(_with_parents(module, m, modules) for m in out)) if out else set()
    out.discard(module)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def gpudash_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {m: imports_of(m, modules) for m in modules}


def test_the_cycle_finder_finds_a_circle_and_reads_every_kind_of_import(tmp_path: Path) -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "low.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub import high\n")
    (pkg / "sub" / "high.py").write_text("def f():\n    from .. import low\n    from . import other\n")
    (pkg / "sub" / "other.py").write_text("import pkg.low\n")
    modules = {"pkg": pkg / "__init__.py", "pkg.sub": pkg / "sub" / "__init__.py", "pkg.low": pkg / "low.py",
               "pkg.sub.high": pkg / "sub" / "high.py", "pkg.sub.other": pkg / "sub" / "other.py"}
    assert imports_of("pkg.low", modules) == {"pkg.sub", "pkg.sub.high"}  # pkg/sub/__init__ runs too
    assert imports_of("pkg.sub.high", modules) == {"pkg.low", "pkg.sub.other"}  # its own parents ran already
    assert imports_of("pkg.sub.other", modules) == {"pkg.low"}


def test_a_package_init_that_imports_its_submodules_closes_a_circle_through_a_module_outside(tmp_path: Path) -> None:
    """The shape that made `import gpudash.shares` fail: outer -> pkg.spec runs pkg/__init__, which imports
    pkg.kind, which imports outer. Read without parents the graph has no circle; with them it has."""
    pkg = tmp_path / "top" / "pkg"
    pkg.mkdir(parents=True)
    (tmp_path / "top" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from top.pkg.kind import Kind\n")
    (pkg / "spec.py").write_text("class Spec: ...\n")
    (pkg / "kind.py").write_text("from top.outer import thing\nclass Kind: ...\n")
    (tmp_path / "top" / "outer.py").write_text("from top.pkg.spec import Spec\nthing = 1\n")
    modules = {"top": tmp_path / "top" / "__init__.py", "top.pkg": pkg / "__init__.py", "top.pkg.spec": pkg / "spec.py",
               "top.pkg.kind": pkg / "kind.py", "top.outer": tmp_path / "top" / "outer.py"}
    graph = {m: imports_of(m, modules) for m in modules}
    assert circles(graph) == [["top.outer", "top.pkg", "top.pkg.kind"]]


def test_gpudash_has_no_import_circle() -> None:
    graph = gpudash_graph()
    assert len(graph) > 100 and graph["gpudash.runtime.session"]  # the walk saw the package
    assert circles(graph) == []


def test_records_and_labels_are_the_ground_floor() -> None:
    graph = gpudash_graph()
    assert graph["gpudash.labels"] == set()
    assert graph["gpudash.records"] == {"gpudash.labels"}


def test_nothing_the_rig_imports_imports_the_rig() -> None:
    graph = gpudash_graph()
    below: set[str] = set()
    todo = list(graph["gpudash.telemetry.rig"])
    while todo:
        m = todo.pop()
        if m not in below:
            below.add(m)
            todo.extend(graph[m])
    assert {"gpudash.telemetry.sim", "gpudash.telemetry.topology", "gpudash.telemetry.nvml"} <= below
    assert "gpudash.telemetry.rig" not in below
