"""The house rules the import graph must keep (ARCHITECTURE.md): no import cycle, function-level
imports included; analysis never imports report; and no module outside native/ special-cases a
native engine by name. Pure source analysis: nothing is imported or run."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.native import ENGINES

ROOT = Path(__file__).resolve().parent.parent
# native/ and web/ live at the top level but install as harness.native and harness.web (pyproject).
PACKAGES = {"harness": "harness", "native": "harness.native", "web": "harness.web"}


def modules() -> dict[str, Path]:
    found = {}
    for top, package in PACKAGES.items():
        for path in (ROOT / top).rglob("*.py"):
            if "node_modules" in path.parts:
                continue
            parts = list(path.relative_to(ROOT / top).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


def imported(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules `module` imports anywhere in its source (module level or inside a function)."""

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pkg import mod` imports the module pkg.mod; `from pkg import name` imports pkg
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        found |= {target for name in names if (target := resolve(name)) is not None and target != module}
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    return {module: imported(module, path, known) for module, path in known.items()}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module importing itself back."""
    return sorted(
        sorted(group)
        for group in {frozenset(m for m in reachable(graph, start) if start in reachable(graph, m)) for start in graph}
        if len(group) > 1
    )


def test_the_walk_sees_function_level_imports(graph) -> None:
    # harness.run.outputs imports the report writers inside write_outputs only
    assert "harness.report" in graph["harness.run.outputs"]
    assert {"harness.native", "harness.web.driver"} <= set().union(*graph.values())
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle(graph) -> None:
    assert cycles(graph) == []


def part(module: str) -> str:
    """The part a module belongs to: harness.<part> (harness.store is a part of its own)."""
    return ".".join(module.split(".")[:2])


def part_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between parts: an arrow wherever one module of a part imports one of another."""
    parts: dict[str, set[str]] = {part(m): set() for m in graph}
    for module, targets in graph.items():
        parts[part(module)] |= {part(t) for t in targets} - {part(module)}
    return parts


def test_the_part_walk_sees_an_arrow_between_parts(graph) -> None:
    assert "harness.run" in part_graph(graph)["harness.cli"]
    assert part_graph({"x.a.m": {"x.b.n"}, "x.b.n": {"x.a.k"}, "x.a.k": set()}) == {"x.a": {"x.b"}, "x.b": {"x.a"}}


def test_no_cycle_between_parts(graph) -> None:
    """Modules may be acyclic while their parts are not (web's memory once imported run's MB while run
    drives web): data flows one way between parts too (ARCHITECTURE.md's picture)."""
    assert cycles(part_graph(graph)) == []


def test_analysis_never_imports_report(graph) -> None:
    analysis = [m for m in graph if m.startswith("harness.analysis")]
    leaks = {m: sorted(t for t in reachable(graph, m) if t.startswith("harness.report")) for m in analysis}
    assert {m: t for m, t in leaks.items() if t} == {}


def test_core_imports_no_other_part(graph) -> None:
    outside = {m: sorted(t for t in targets if not t.startswith("harness.core")) for m, targets in graph.items()}
    assert {m: targets for m, targets in outside.items() if m.startswith("harness.core") and targets} == {}


def test_the_store_knows_no_reader(graph) -> None:
    readers = ("harness.analysis", "harness.report", "harness.cli", "harness.run", "harness.suite")
    assert sorted(t for t in reachable(graph, "harness.store") if t.startswith(readers)) == []


def engine_comparisons(source: str, where: str) -> list[str]:
    """`x == "torch"`, `engine in ("torch", "jax")` and the like: code that branches on an engine's name."""

    def names(node: ast.expr) -> set[str]:
        items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
        return {i.value for i in items if isinstance(i, ast.Constant) and i.value in ENGINES}

    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, ast.Compare) and (hit := set().union(*map(names, [node.left, *node.comparators]))):
            found.append(f"{where}:{node.lineno} compares with {', '.join(sorted(hit))}")
    return found


def test_the_engine_check_finds_a_branch_on_an_engine_name() -> None:
    source = 'if target.engine == "torch":\n    pass\nok = engine not in ("onnxruntime", "cpu")\nlabel = "torch"\n'
    assert engine_comparisons(source, "x.py") == ["x.py:1 compares with torch", "x.py:3 compares with onnxruntime"]


def test_no_module_outside_native_branches_on_an_engine_name() -> None:
    """Engine knowledge lives on the Backend protocol (native/base.py): a new engine is one file in native/
    and one registry line, and nothing else names it (BASELINE and the label rule hold names as data)."""
    outside = [*(ROOT / "harness").rglob("*.py"), *(ROOT / "web").glob("*.py")]
    hits = [hit for path in outside for hit in engine_comparisons(path.read_text(), str(path.relative_to(ROOT)))]
    assert hits == []


def architecture_rows() -> dict[str, str]:
    """ARCHITECTURE.md's table of parts: each part's folder (its first cell) -> the row's text."""
    rows = {}
    for line in (ROOT / "ARCHITECTURE.md").read_text().splitlines():
        cells = line.split(" | ")
        if line.startswith("| `") and len(cells) > 1:
            for folder in cells[0].strip("| ").split(", "):
                rows[folder.strip("`").split("`")[0]] = line
    return rows


def test_architecture_names_every_module_in_its_part() -> None:
    """ARCHITECTURE.md stays true to the tree: every module is named in its part's row (the engines of
    native/ by the rule that names them: `<engine>_backend.py`, one per engine)."""
    rows = architecture_rows()
    unnamed = []
    for path in sorted(
        [*(ROOT / "harness").rglob("*.py"), *(ROOT / "native").glob("*.py"), *(ROOT / "web").glob("*.py")]
    ):
        relative = path.relative_to(ROOT).as_posix()
        if path.name == "__init__.py" or (relative.startswith("native/") and path.name.endswith("_backend.py")):
            continue
        part = max((folder for folder in rows if relative.startswith(folder)), key=len, default=None)
        name = relative[len(part) :] if part else relative
        if part is None or (name and f"`{name}`" not in rows[part]):  # a one-module part is its row
            unnamed.append(relative)
    assert unnamed == []


def documented_arrows() -> dict[str, set[str]]:
    """The arrows between parts ARCHITECTURE.md lists ("run -> core, native, ...")."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    block = text.split("<!-- arrows: begin -->")[1].split("<!-- arrows: end -->")[0]
    arrows = {}
    for line in block.splitlines():
        if "->" in line:
            source, targets = (side.strip() for side in line.split("->"))
            arrows[source] = {t.strip() for t in targets.split(",") if t.strip()}
    return arrows


def test_architecture_lists_every_arrow_between_parts(graph) -> None:
    short = {p.removeprefix("harness.") or "harness": {t.removeprefix("harness.") or "harness" for t in ts}
             for p, ts in part_graph(graph).items()}  # fmt: skip
    assert documented_arrows() == {p: ts for p, ts in short.items() if ts}


def test_ab_is_a_part_of_its_own(graph) -> None:
    """`ab`'s modules live in harness/ab/, not in run/ (which once held four ab*.py), and only the CLI and the
    public API reach them."""
    assert sorted(p.name for p in (ROOT / "harness" / "run").glob("ab*.py")) == []
    importers = {part(m) for m, targets in graph.items() if any(t.startswith("harness.ab") for t in targets)}
    assert importers - {"harness.ab"} <= {"harness.cli", "harness"}
