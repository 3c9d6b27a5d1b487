"""One definition per option (harness.core.options): every command that takes a run option shows the same
flag, help, default and choices, because each is generated from its request's field; the suite config's keys
are declared aliases of those fields; and the one check() refuses a bad value from any entry point alike."""

from __future__ import annotations

import ast
import functools
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import duckdb
import pytest
import typer
from conftest import CLI
from typer.testing import CliRunner

import harness.analysis.options as store_commands
from harness.ab.run import AbRequest, validate_ab
from harness.browser.run import LAUNCH, WebRequest, validate_web
from harness.browser.serve import ServeRequest, ServeSwitch, validate_serve
from harness.cli import app
from harness.cli.common import request_values, with_options
from harness.cli.predict import CASES
from harness.cli.reference import commands as build_commands
from harness.cli.suite import OVERRIDES
from harness.core.options import Opt, RequestError, Shared, check, declared, option, problem
from harness.core.parity import TOLERANCES
from harness.core.precision import MEANINGS
from harness.core.records import PRECISIONS
from harness.run.plan import BenchmarkRequest, RunOptions, validate
from harness.suite.config import OPTION_KEYS, ConfigError, SuiteConfig, load_config
from harness.suite.options import SuiteCommand

# Every request field that more than one command takes under its own name: its one declaration.
SHARED = (
    declared(RunOptions)
    | {"engines": declared(BenchmarkRequest)["engines"]}
    | {name: declared(WebRequest)[name] for name in LAUNCH}
)
BENCHMARKS = ("native", "web", "run", "ab", "suite")


@functools.cache
def commands() -> dict[str, Any]:
    """The app's commands, built once for the module (each build walks every command's signature)."""
    return build_commands()


@dataclass(frozen=True)
class From:
    """Some of a command's options, generated from a dataclass (harness.cli.common.with_options): `names` (None:
    all it declares), `prefix`ed in a command with a native and a browser half (`run --web-hardware` is
    WebRequest's --hardware), `overrides` of the suite config's keys (their help says so)."""

    request: type
    names: tuple[str, ...] | None = None
    prefix: str | None = None
    overrides: bool = False


RESUME = From(Shared, ("resume",))
# Every command and the dataclasses its options are generated from: nothing else (tests below).
BUILT_FROM: dict[str, list[From]] = {
    "native": [From(BenchmarkRequest), RESUME],
    "web": [From(WebRequest), From(ServeRequest), From(ServeSwitch), RESUME],
    "run": [
        From(BenchmarkRequest),
        From(WebRequest, ("hardware", "runtimes"), "web"),
        From(WebRequest, LAUNCH),
        RESUME,
    ],
    "ab": [From(AbRequest), From(store_commands.AbVerdict)],
    "hardware": [],
    "models": [From(store_commands.Models)],
    "db init": [From(store_commands.DbInit)],
    "report": [From(store_commands.Report)],
    "matrix": [From(store_commands.Matrix)],
    # the cases to predict are the run options' (its --precision is the one it predicts for: its own)
    "predict": [From(RunOptions, CASES), From(store_commands.Predict)],
    "recommend": [From(store_commands.Recommend)],
    "compare": [From(store_commands.Compare)],
    "history": [From(store_commands.History)],
    "query": [From(store_commands.Query)],
    "export": [From(store_commands.Export)],
    "import": [From(store_commands.Import)],
    "merge": [From(store_commands.Merge)],
    "suite": [From(SuiteCommand), From(RunOptions, OVERRIDES, overrides=True)],
}
# The options several commands take, each declared once: every part's (harness.core.options.Shared) and the
# store's commands' (harness.analysis.options.Shared); a command's field reuses one, its help the declared one's
# followed by that command's choices and note (Opt.narrowed).
SHARED_DECLARATIONS = declared(Shared) | {f"store {k}": v for k, v in declared(store_commands.Shared).items()}
# A flag that means different things in different commands: one declaration per meaning, and why.
FLAG_MEANINGS = {
    "--hardware": ("native platforms to run on", "browser EPs to run on", "a filter of the rows read or run"),
    "--model": ("models to run", "the one model whose rows are read (predict: or a spec)"),
    "--mode": ("modes to run", "recommend, predict: the one mode read"),
    "--precision": ("precisions to run", "predict: the one precision to predict for"),
    "--engines": ("native engines to run", "predict: a filter of its targets"),
    "--timeout": ("a case's worker or page", "predict: the graph's export and count"),
    "--plot-comparison": ("compare: the plot's file", "suite: the two runs to plot"),
    "--browser": ("browsers to run", "recommend: the one browser whose page rows are ranked"),
}


def shown(command: Any, name: str) -> tuple[list[str], str, Any] | None:
    """The flag(s), help and default a command's --help shows for the parameter `name`, or None."""
    for param in command.params:
        if param.name == name:
            return param.opts, param.help or "", param.default
    return None


@pytest.mark.parametrize("name", sorted(SHARED))
def test_every_command_shows_a_shared_option_as_its_one_definition(name: str) -> None:
    """Same flag, same help (the suite's overrides add only where their default comes from), same default."""
    opt = SHARED[name]
    # suite's own --models/--hardware filter the config: only its OVERRIDES are run options
    found = {cmd: shown(commands()[cmd], name) for cmd in BENCHMARKS if cmd != "suite" or name in OVERRIDES}
    taking = {cmd: seen for cmd, seen in found.items() if seen is not None}
    assert taking, f"no command takes {opt.flag}"
    for cmd, (flags, help_text, default) in taking.items():
        assert flags == [opt.flag], (cmd, flags)
        if cmd == "suite":  # an override of the config's key: no default of its own
            assert help_text == f"{opt.help} Default: the config's {opt.key or name}.", cmd
            assert default is None
        else:
            assert help_text == opt.help, cmd
    defaults = {str(seen[2]) for cmd, seen in taking.items() if cmd != "suite"}
    assert len(defaults) <= 1, f"{opt.flag} defaults differ: {defaults}"


def fields_of(sources: list[From]) -> dict[str, Opt]:
    """The options a command is built from, by the parameter names with_options gives them, as it shows them."""
    found: dict[str, Opt] = {}
    for source in sources:
        for name, opt in declared(source.request).items():
            if source.names is None or name in source.names:
                opt = opt.prefixed(source.prefix)
                if source.overrides:
                    opt = Opt(opt.flag, f"{opt.help} Default: the config's {opt.key or name}.")
                found[f"{source.prefix}_{name}" if source.prefix else name] = opt
    return found


def typed_in_cli(command: Any, sources: list[From]) -> list[str]:
    """The options `command` shows that are not a declared field of what it is built from, with that field's
    flag and help: each one typed in cli/ (an argument, which has no flag, is the command's own)."""
    fields = fields_of(sources)
    return [
        param.opts[0]
        for param in command.params
        if param.param_type_name == "option"
        and (
            param.name not in fields
            or (param.opts[0], param.help) != (fields[param.name].flag, fields[param.name].help)
        )
    ]


@pytest.mark.parametrize("command", sorted(BUILT_FROM))
def test_no_option_is_typed_in_the_cli(command: str) -> None:
    """Every option of every command is a declared field of a dataclass it is built from (its request, or its
    options' dataclass: harness.analysis.options for the store's commands), shown with that field's flag and
    help. A choice option's help names every choice (its table's)."""
    assert typed_in_cli(commands()[command], BUILT_FROM[command]) == [], f"{command}: declare it (option/reuse)"
    for opt in fields_of(BUILT_FROM[command]).values():
        assert all(choice in opt.help for choice in opt.choices or ()), (opt.flag, opt.help)


def test_every_command_is_checked_for_typed_options() -> None:
    assert set(BUILT_FROM) == set(commands())


def test_a_typed_option_is_found() -> None:
    """The check above fails on a flag typed in a command: planted beside a declared one."""
    planted = typer.Typer()

    @planted.command()
    @with_options(store_commands.Query, ("fmt",))
    def query(*, fmt: str, limit: Annotated[int, typer.Option("--limit", help="Rows.")] = 10) -> None: ...

    @planted.command()
    def other() -> None: ...  # two commands: a group, whose commands carry no completion options

    command = typer.main.get_command(planted).commands["query"]  # type: ignore[attr-defined]
    assert typed_in_cli(command, [From(store_commands.Query, ("fmt",))]) == ["--limit"]
    assert typed_in_cli(command, [From(store_commands.Query, ("fmt", "out"))]) == ["--limit"]


def typer_options_in(source: str) -> list[int]:
    """The lines of `source` that make a typer.Option (typer.Option(...), or Option imported from typer)."""
    tree = ast.parse(source)
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Attribute) and node.func.attr == "Option")
            or (isinstance(node.func, ast.Name) and node.func.id == "Option")
        )
    )


def test_cli_makes_a_typer_option_in_one_place() -> None:
    """No module of harness/cli/ writes a typer.Option but with_options' (common._parameter), from a declared
    field; the scan finds a planted one."""
    cli = Path(__file__).resolve().parent.parent / "harness" / "cli"
    found = {path.name: typer_options_in(path.read_text()) for path in sorted(cli.glob("*.py"))}
    assert {name: lines for name, lines in found.items() if lines and name != "common.py"} == {}
    assert len(found["common.py"]) == 1
    assert typer_options_in('x: Annotated[str, typer.Option("--x", help="X.")] = "a"\n') == [1]


def base_of(opt: Opt) -> tuple[str, str]:
    """The declaration an option shown by a command comes from: a shared one whose flag it has and whose help its
    help begins with (a narrowed reuse), else its own."""
    for shared in SHARED_DECLARATIONS.values():
        if opt.flag == shared.flag and opt.help.startswith(shared.help):
            return shared.flag, shared.help
    return opt.flag, opt.help


def test_a_flag_of_several_commands_is_one_declaration() -> None:
    """Across every command, the options shown under one flag come from one declaration, unless the flag means
    different things (FLAG_MEANINGS: one declaration per meaning)."""
    bases: dict[str, set[str]] = {}
    for sources in BUILT_FROM.values():
        for opt in fields_of(sources).values():
            flag, help_text = base_of(opt)
            bases.setdefault(flag, set()).add(help_text.split(" Default: the config's")[0])
    several = {flag: len(helps) for flag, helps in bases.items() if len(helps) > 1}
    assert several == {flag: len(meanings) for flag, meanings in FLAG_MEANINGS.items()}


@pytest.mark.parametrize("name", sorted(SHARED_DECLARATIONS))
def test_every_command_shows_a_shared_declaration_as_declared(name: str) -> None:
    """A shared declaration (--db, --run, --format, --out, --fail-on-regression, --threshold, …) is shown by two
    commands or more, each with its flag and its help followed only by the command's own choices and note."""
    opt = SHARED_DECLARATIONS[name]
    taking = {
        command: param
        for command, sources in BUILT_FROM.items()
        for param in commands()[command].params
        if param.param_type_name == "option" and base_of(fields_of(sources).get(param.name, Opt("", ""))) == (
            opt.flag, opt.help)
    }  # fmt: skip
    assert len(taking) >= 2, f"{opt.flag}: declared as shared, taken by {sorted(taking)}"
    for command, param in taking.items():
        assert param.opts == [opt.flag] and (param.help or "").startswith(opt.help), (command, param.help)


def test_an_option_taken_under_another_flag_is_the_same_declaration() -> None:
    """ab's --hardware is native's; run's and ab's --web-hardware are web's --hardware (prefixed); ab's and
    web --serve's fields reuse the declaring request's option: flag, help, choices and bound alike."""
    native, browser = declared(BenchmarkRequest)["hardware"], declared(WebRequest)["hardware"]
    assert declared(AbRequest)["hardware"] is native
    run_fields = fields_of(BUILT_FROM["run"])
    assert declared(AbRequest)["web_hardware"] == run_fields["web_hardware"] == browser.prefixed("web")
    assert browser.prefixed("web").flag == "--web-hardware" and browser.prefixed("web").choices == browser.choices
    assert declared(ServeRequest)["hardware"] is browser
    assert declared(AbRequest)["threads"] is declared(WebRequest)["threads"]
    for command in ("run", "ab"):
        shown_help = shown(commands()[command], "web_hardware")
        assert shown_help is not None and shown_help[:2] == (["--web-hardware"], browser.help), command


def _config(tmp_path: Path, line: str) -> Path:
    path = tmp_path / "suite.toml"
    path.write_text(f'{line}\n[model_families]\nembedding = ["bert-tiny"]\n')
    return path


# A bad value of a declared option, from the command line, the Python API and (where it is a key) the suite config:
# each refused by the one check(), named as that entry point names it.
REFUSED = [
    (
        ["web", "--model", "bert-tiny", "--browser", "opera"],
        lambda: validate_web(WebRequest(models=["bert-tiny"], browsers=["opera"])),
        'browsers = ["opera"]',
        "unknown browser 'opera'; valid: chrome, chromium, edge, firefox, safari",
    ),
    (
        ["web", "--model", "bert-tiny", "--hardware", "webnn", "--webnn-device", "tpu"],
        lambda: validate_web(WebRequest(models=["bert-tiny"], hardware=["webnn"], webnn_device="tpu")),
        None,
        "--webnn-device: unknown WebNN device 'tpu'; valid: cpu, gpu, npu",
    ),
    (
        ["run", "--model", "bert-tiny", "--web-hardware", "webgl"],
        lambda: validate_ab(AbRequest(a="bert-tiny", b="bert-tiny", web_hardware=["webgl"])),
        'web_platforms = ["webgl"]',
        "--web-hardware: unknown web hardware 'webgl'; valid: wasm, webgpu, webnn",
    ),
    (
        ["web", "--serve", "--model", "bert-tiny", "--max-devices", "0"],
        lambda: validate_serve(ServeRequest(models=["bert-tiny"], max_devices=0)),
        None,
        "--max-devices takes a whole number from 1 to 1,000 (got 0)",
    ),
    (
        ["web", "--serve", "--model", "bert-tiny", "--port", "70000"],
        lambda: validate_serve(ServeRequest(models=["bert-tiny"], port=70000)),
        None,
        "--port takes a whole number from 0 to 65,535 (got 70000)",
    ),
    (
        ["ab", "--a", "bert-tiny", "--b", "bert-tiny", "--block-time", "-1"],
        lambda: validate_ab(AbRequest(a="bert-tiny", b="bert-tiny", block_time_s=-1)),
        None,
        "--block-time takes a finite number of seconds >= 0 and <= 3600 (got -1)",
    ),
    (
        ["ab", "--a", "bert-tiny", "--b", "bert-tiny", "--a-precision", "fp8"],
        lambda: validate_ab(AbRequest(a="bert-tiny", b="bert-tiny", a_precision="fp8")),
        None,
        "--a-precision: unknown precision 'fp8'; valid: fp32",
    ),
    (
        ["predict", "--model", "bert-tiny", "--batch-sizes", "0"],
        None,
        "batch_sizes = [0]",
        "--batch-sizes takes whole numbers from 1 to 4,096 (got 0)",
    ),
]


@pytest.mark.parametrize(("args", "api", "config", "message"), REFUSED, ids=[r[0][-2] for r in REFUSED])
def test_check_refuses_a_bad_value_from_every_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], api: Any, config: str | None, message: str
) -> None:
    """The command line exits 2 with the message and writes nothing; the API raises RequestError with it; the
    suite config's key is refused by the same option, named by its key."""
    monkeypatch.chdir(tmp_path)
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 2 and message in " ".join(done.output.split()), done.output
    assert "Traceback" not in done.output and list(tmp_path.iterdir()) == []
    if api is not None:
        with pytest.raises(RequestError) as raised:
            api()
        assert message.split(":")[-1].split("(")[0].strip() in str(raised.value), raised.value
    if config is not None:
        key = config.split(" = ")[0]
        with pytest.raises(ConfigError, match=f"key '{key}'"):
            load_config(_config(tmp_path, config))


def test_the_benchmark_commands_take_the_same_run_options() -> None:
    """native, web and run take every run option; run takes --engines as native does."""
    for cmd in ("native", "web", "run"):
        missing = [name for name in RunOptions.__dataclass_fields__ if shown(commands()[cmd], name) is None]
        assert not missing, (cmd, missing)
    assert shown(commands()["run"], "engines") == shown(commands()["native"], "engines")


def test_every_precision_help_lists_the_one_precision_table() -> None:
    """--precision's choices and help come from core.precision.MEANINGS (+ auto) wherever it is taken."""
    assert (*MEANINGS, "auto") == PRECISIONS
    assert set(TOLERANCES) == set(MEANINGS)  # the parity check knows every precision the table names
    assert declared(RunOptions)["precision"].choices == PRECISIONS
    for cmd in ("native", "web", "run", "ab"):
        _, help_text, _ = shown(commands()[cmd], "precision") or ([], "", None)
        assert all(p in help_text for p in PRECISIONS), (cmd, help_text)


def test_run_help_prints_engines() -> None:
    """The --help a user reads (a subprocess of the real CLI) names --engines and the q4 precisions."""
    done = subprocess.run([*CLI, "run", "--help"], capture_output=True, text=True, timeout=300, env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    assert "--engines" in done.stdout and "q4f16" in done.stdout


def test_run_refuses_an_unknown_engine_as_native_does(tmp_path: Path) -> None:
    for cmd in ("native", "run"):
        done = subprocess.run(
            [*CLI, cmd, "--model", "bert-tiny", "--engines", "tensorflow"],
            capture_output=True, text=True, timeout=300, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 2, done.stdout + done.stderr
        assert "--engines: unknown engine 'tensorflow'; valid: torch, onnxruntime" in done.stderr
        assert "Traceback" not in done.stderr
        assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs Chromium at /usr/bin/chromium")
def test_run_engines_narrows_its_native_half(tmp_path: Path) -> None:
    """`run --engines onnxruntime`: the native half runs ONNX Runtime only (without it torch and OpenVINO run on
    cpu too), the browser half runs as before, and the run's stored arguments say so."""
    db = tmp_path / "r.duckdb"
    done = subprocess.run(
        [*CLI, "run", "--model", "bert-tiny", "--hardware", "cpu", "--engines", "onnxruntime", "--web-hardware",
         "wasm", "--iterations", "3", "--warmup", "0", "--min-duration", "0", "--db", str(db), "--output-dir",
         str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with duckdb.connect(str(db), read_only=True) as store:
        engines = sorted(r[0] for r in store.execute("SELECT engine FROM results").fetchall())
        (arguments,) = store.execute("SELECT arguments FROM runs").fetchone() or ("",)
    assert engines == ["onnxruntime", "onnxruntime-web"]
    assert json.loads(arguments)["native"]["engines"] == ["onnxruntime"]


def test_the_suite_configs_keys_are_aliases_of_the_fields() -> None:
    """The seed's key names stay (warmup_iterations, benchmark_iterations, timeout, …), declared on the fields;
    each is a SuiteConfig key and is checked by the field's option."""
    aliases = {opt.key: opt.flag for opt, _ in OPTION_KEYS.values() if opt.key}
    assert aliases == {
        "warmup_iterations": "--warmup",
        "benchmark_iterations": "--iterations",
        "timeout": "--timeout",
        "prepare_timeout": "--prepare-timeout",
        "db": "--db",
        "hardware_types": "--hardware",
        "web_platforms": "--hardware",
        "web_threads": "--threads",
        "web_runtimes": "--runtimes",
    }
    assert set(OPTION_KEYS) <= set(SuiteConfig.__dataclass_fields__)
    assert OPTION_KEYS["warmup_iterations"][0] is declared(RunOptions)["warmup"]
    for key, (opt, _) in OPTION_KEYS.items():
        if opt.low is not None:  # the same bound names the key and the flag
            below = [opt.low - 1] if opt.many else opt.low - 1
            assert problem(f"key '{key}'", opt, below) == problem(opt.flag, opt, below).replace(
                opt.flag, f"key '{key}'"
            )


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (BenchmarkRequest(warmup=-1), "--warmup takes a whole number from 0 to 1,000,000 (got -1)"),
        (BenchmarkRequest(precision="fp8"), "--precision: unknown precision 'fp8'; valid: fp32, fp16, bf16"),
        (BenchmarkRequest(modes=["chat"]), "--mode: unknown mode 'chat'; valid: inference, generate, training"),
        (BenchmarkRequest(timeout_s=float("inf")), "--timeout takes a finite number of seconds > 0 and <= 604800"),
        (BenchmarkRequest(native_threads=[1, 0]), "--native-threads takes whole numbers from 1 to 256 (got 0)"),
        (BenchmarkRequest(prepare_timeout_s=0), "--prepare-timeout takes a finite number of seconds > 0"),
    ],
)
def test_the_python_api_is_checked_by_the_same_check(request_: BenchmarkRequest, message: str) -> None:
    """A request built in Python is refused with the flag's own message, before anything is probed."""
    with pytest.raises(RequestError) as raised:
        validate(request_)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"precision": "fp32,int8"}, "--precision fp32,int8: a variant runs one precision"),
        ({"b_precision": "fp8"}, "--b-precision: unknown precision 'fp8'; valid: fp32"),
    ],
)
def test_ab_checks_each_variants_precision_by_the_one_definition(fields: dict[str, str], message: str) -> None:
    from harness.ab.run import validate_ab

    with pytest.raises(RequestError) as raised:
        validate_ab(AbRequest(a="bert-tiny", b="bert-tiny", **fields))
    assert message in str(raised.value)


def test_adding_an_option_is_one_field() -> None:
    """A new field with option() is a flag of the command built from it, parsed and checked, with no other line."""

    @dataclass
    class Deeper(RunOptions):
        depth: list[int] = option(factory=lambda: [2], flag="--depth", many=True, low=1, high=8, help="Depths.")

    app = typer.Typer()
    seen: dict[str, Any] = {}

    @app.command()
    @with_options(Deeper, ("depth", "warmup"))
    def bench(**options: Any) -> None:
        request = Deeper(**request_values(Deeper, options))
        try:
            check(request, declared(Deeper))
        except RequestError as exc:
            raise typer.BadParameter(str(exc)) from None
        seen["request"] = request

    runner = CliRunner()
    assert runner.invoke(app, ["--depth", "1,4", "--warmup", "0"]).exit_code == 0
    assert seen["request"].depth == [1, 4] and seen["request"].warmup == 0
    refused = runner.invoke(app, ["--depth", "9"])
    assert refused.exit_code == 2 and "--depth takes whole numbers from 1 to 8 (got 9)" in refused.output
    assert "Depths." in runner.invoke(app, ["--help"]).output
