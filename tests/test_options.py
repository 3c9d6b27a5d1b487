"""One definition per option (harness.core.options): every command that takes a run option shows the same
flag, help, default and choices, because each is generated from its request's field; the suite config's keys
are declared aliases of those fields; and the one check() refuses a bad value from any entry point alike."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pytest
import typer
from conftest import CLI
from typer.testing import CliRunner

from harness.ab.run import AbRequest
from harness.browser.run import WebRequest
from harness.cli.common import request_values, with_options
from harness.cli.reference import commands
from harness.cli.suite import OVERRIDES
from harness.core.options import RequestError, check, declared, option, problem
from harness.core.parity import TOLERANCES
from harness.core.precision import MEANINGS
from harness.core.records import PRECISIONS
from harness.run.plan import BenchmarkRequest, RunOptions, validate
from harness.suite.config import OPTION_KEYS, SuiteConfig

# Every request field that more than one command takes: its one declaration.
SHARED = (
    declared(RunOptions)
    | {"engines": declared(BenchmarkRequest)["engines"]}
    | {name: declared(WebRequest)[name] for name in ("threads", "gpu")}
)
BENCHMARKS = ("native", "web", "run", "ab", "suite")


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
