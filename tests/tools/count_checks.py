"""Count what the tests check, read from their source (no test is run): real runs and assertions.

    python tests/tools/count_checks.py [TESTS_DIR]   # per module, then the totals

A *real run* is a call that measures: the CLI with a benchmark command (native, web, run, ab, suite, but
not `--check`, `--create-config`, `--plot-only` or `--help`), or the Python API's run_native, run_web,
run_both, run_suite, run_ab. A helper function that makes one counts where it is called. A test's runs
are multiplied by its `parametrize` cases, a module-scoped fixture's by its `params`; a function-scoped
fixture's by the tests that use it. Loops are not unrolled: a run inside a loop counts once, so the
figure is a lower bound, computed the same way for any two trees compared.

An *assertion* is an `assert` statement, a `pytest.raises`/`pytest.warns` block or an
`np.testing.assert_*` call, counted the same way (each occurrence once, times the parametrize cases).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

BENCHMARKS = {"native", "web", "run", "ab", "suite"}
NOT_MEASURING = {"--check", "--create-config", "--plot-only", "--help", "--serve-check"}
API_RUNS = {"run_native", "run_web", "run_both", "run_suite", "run_ab"}
CLI_CALLS = {
    "run_cli",
    "run_cli_process",
    "run_cli_in_process",
    "CliProcess",
    "run",
    "Popen",
    "cli",
    "check_output",
    "call",
}


@dataclass
class Function:
    name: str
    runs: int = 0  # direct run calls
    calls: list[str] = field(default_factory=list)  # names of functions it calls
    asserts: int = 0
    cases: int = 1  # parametrize cases (a test) or params (a fixture)
    fixture: str | None = None  # "module"/"session"/"function" for a fixture
    arguments: list[str] = field(default_factory=list)


def literal_strings(node: ast.AST, constants: dict[str, list[str]]) -> list[str]:
    """The string arguments a call's argument expression stands for, as far as the source says."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Starred):
        return literal_strings(node.value, constants)
    if isinstance(node, ast.Name):
        return constants.get(node.id, [])
    if isinstance(node, ast.List | ast.Tuple):
        return [s for element in node.elts for s in literal_strings(element, constants)]
    if isinstance(node, ast.Subscript):  # RUN[1:3]: the constant's strings, enough to see the command
        return literal_strings(node.value, constants)
    return []


def call_name(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def is_run(call: ast.Call, constants: dict[str, list[str]]) -> bool:
    name = call_name(call)
    if name in API_RUNS:
        return True
    if name not in CLI_CALLS:
        return False
    words = [s for arg in call.args for s in literal_strings(arg, constants)]
    command = next((w for w in words if not w.startswith("-") and w not in ("harness.cli", "sh")), None)
    return command in BENCHMARKS and not NOT_MEASURING & set(words)


def parametrize_cases(decorators: list[ast.expr], lengths: dict[str, int]) -> tuple[int, str | None]:
    """(the product of the parametrize cases, the fixture scope if this is a fixture); `lengths`: the module's
    list constants by name (parametrize("models", KIND_SUBSETS))."""
    cases, scope = 1, None
    for decorator in decorators:
        call = decorator if isinstance(decorator, ast.Call) else None
        name = ast.unparse(call.func if call else decorator)
        if name.endswith("parametrize") and call and len(call.args) > 1:
            values = call.args[1]
            if isinstance(values, ast.List | ast.Tuple):
                cases *= len(values.elts)
            elif isinstance(values, ast.Name):
                cases *= lengths.get(values.id, 1)
        if name.endswith("fixture"):
            scope = "function"
            for keyword in call.keywords if call else []:
                if keyword.arg == "scope" and isinstance(keyword.value, ast.Constant):
                    scope = keyword.value.value
                if keyword.arg == "params" and isinstance(keyword.value, ast.List | ast.Tuple):
                    cases *= len(keyword.value.elts)
    return cases, scope


def read_module(path: Path) -> dict[str, Function]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    constants = list_constants([n for n in tree.body if isinstance(n, ast.Assign)], {})  # NATIVE = [...]
    lengths = {
        node.targets[0].id: len(node.value.elts)
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)
        if isinstance(node.value, ast.List | ast.Tuple)
    }
    functions: dict[str, Function] = {}
    for node in tree.body:  # module-level functions; a class's methods together as one helper named for it
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = read_function(node, constants, lengths)
        elif isinstance(node, ast.ClassDef):
            methods = [read_function(m, constants, lengths) for m in node.body if isinstance(m, ast.FunctionDef)]
            runner = Function(node.name, runs=sum(m.runs for m in methods), asserts=sum(m.asserts for m in methods))
            runner.calls = [c for m in methods for c in m.calls]
            functions[node.name] = runner
    return functions


def list_constants(body: list[ast.stmt], outer: dict[str, list[str]]) -> dict[str, list[str]]:
    """The names bound to lists or tuples of strings in `body` (a function's: args = [...]), over `outer`'s."""
    constants = dict(outer)
    for statement in body:
        for node in ast.walk(statement):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                continue
            target, value = node.targets[0], node.value
            strings = literal_strings(value, constants) if isinstance(value, ast.List | ast.Tuple) else []
            if isinstance(target, ast.Name) and strings:
                constants[target.id] = strings
    return constants


def read_function(node: ast.FunctionDef, module_constants: dict[str, list[str]], lengths: dict[str, int]) -> Function:
    constants = list_constants(node.body, module_constants)
    cases, scope = parametrize_cases(node.decorator_list, lengths)
    function = Function(node.name, cases=cases, fixture=scope, arguments=[a.arg for a in node.args.args])
    for inner in ast.walk(node):
        if isinstance(inner, ast.Assert):
            function.asserts += 1
        elif isinstance(inner, ast.Call):
            name = call_name(inner)
            if name in ("raises", "warns") or name.startswith("assert_"):
                function.asserts += 1
            if is_run(inner, constants):
                function.runs += 1
            elif name:
                function.calls.append(name)
    return function


def runs_of(
    name: str, here: dict[str, Function], everywhere: dict[str, Function], seen: frozenset = frozenset()
) -> int:
    """A function's runs, its helpers' included (one of this module's first, else another test module's)."""
    function = here.get(name) or everywhere.get(name)
    if function is None or name in seen or (function.fixture and seen):
        return 0
    return function.runs + sum(runs_of(c, here, everywhere, seen | {name}) for c in function.calls)


def count(tests: Path) -> dict[str, tuple[int, int]]:
    modules = {path.name: read_module(path) for path in sorted(tests.glob("*.py"))}
    everything = {name: f for functions in modules.values() for name, f in functions.items() if not f.fixture}
    figures: dict[str, tuple[int, int]] = {}
    for module, functions in modules.items():
        tests_here = [f for f in functions.values() if f.name.startswith("test_")]
        runs = asserts = 0
        for f in functions.values():
            if f.name.startswith("test_"):
                runs += f.cases * runs_of(f.name, functions, everything)
                asserts += f.cases * f.asserts
            elif f.fixture:
                users = sum(t.cases for t in tests_here if f.name in t.arguments)
                times = f.cases * (users if f.fixture == "function" else 1)
                runs += times * runs_of(f.name, functions, everything)
                asserts += times * f.asserts
            else:  # a helper's assertions count once per call site in this module's tests and fixtures
                callers = sum(g.cases * g.calls.count(f.name) for g in functions.values() if g is not f)
                asserts += callers * f.asserts
        figures[module] = (runs, asserts)
    return figures


def main() -> None:
    tests = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
    figures = count(tests)
    for module, (runs, asserts) in figures.items():
        if runs or asserts:
            print(f"{module:32} runs {runs:4}  assertions {asserts:5}")
    total_runs = sum(r for r, _ in figures.values())
    total_asserts = sum(a for _, a in figures.values())
    print(f"{'total':32} runs {total_runs:4}  assertions {total_asserts:5}")


if __name__ == "__main__":
    main()
