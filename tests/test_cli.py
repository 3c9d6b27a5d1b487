"""Bad input: a one-line error naming what is valid, exit code 2, and nothing written."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest
from conftest import QUICK, run_cli, run_cli_process
from onnx import TensorProto, helper
from test_native_run import rows

from harness.store import open_store


def _tiny_onnx(path: Path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence"])
    graph = helper.make_graph([helper.make_node("Tanh", ["x"], ["y"])], "tanh", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)


def _truncated_onnx(path: Path) -> None:
    _tiny_onnx(path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _newer_store(path: Path) -> None:
    with open_store(path) as store:
        store.start_run("native", {}, {})
        store.connection.execute("INSERT INTO schema_version VALUES (99, now())")


def _model_dir_with_binary_config(path: Path) -> None:
    path.mkdir()
    (path / "config.json").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")


def _model_dir_with_a_wrong_type(path: Path) -> None:
    path.mkdir()
    (path / "config.json").write_text('{"model_type": "bert", "hidden_size": "big", "num_hidden_layers": 1}')


def _text(text: str | bytes) -> Callable[[Path], None]:
    return lambda path: path.write_bytes(text if isinstance(text, bytes) else text.encode())


SUITE = '[model_families]\nembedding = ["bert-tiny"]\n'
# "@NAME" in a case's arguments: a file (or directory) the test writes first with this builder, passed by path.
INPUT_FILES: dict[str, Callable[[Path], None]] = {
    "tanh.onnx": _tiny_onnx,
    "garbage.onnx": _text(b"these bytes are not an ONNX model \x00\xff\xfe" * 4),
    "truncated.onnx": _truncated_onnx,
    "empty.onnx": _text(b""),
    "my-model": _model_dir_with_binary_config,
    "big-model": _model_dir_with_a_wrong_type,
    "newer.duckdb": _newer_store,
    "suite.toml": _text(SUITE),
    "inf-timeout.toml": _text("timeout = inf\n" + SUITE),
    "nan.json": _text('{"model_families": {"embedding": ["bert-tiny"]}, "min_duration_s": NaN}'),
    "latin1.toml": _text(b'name = "caf\xe9"\n' + SUITE.encode()),
    "binary.toml": _text(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\xcb\x48\xcd\xc9\xc9\x07\x00"),
    "twice.toml": _text("timeout = 60\n[run]\ntimeout = 30\n" + SUITE),
    "below-header.toml": _text(SUITE + "batch_sizes = [2]\n"),
    "no-web-platforms.toml": _text("include_web_platforms = true\nweb_platforms = []\n" + SUITE),
    "runs-nothing.toml": _text("hardware_types = []\ninclude_web_platforms = false\n" + SUITE),
}
# Small runs, so a case a regression lets through fails in seconds instead of benchmarking every model.
NATIVE = ["native", "--model", "bert-tiny", "--hardware", "cpu", "--engines", "onnxruntime", "--iterations", "3"]
WEB = ["web", "--model", "bert-tiny", "--hardware", "wasm", "--iterations", "3"]
RUN = ["run", "--model", "bert-tiny", "--hardware", "cpu", "--web-hardware", "wasm", "--iterations", "3"]
GENERATE = ["run", "--model", "gpt2-tiny", "--mode", "generate", "--sequence-lengths", "32"]
SUITE_CHECK = ["suite", "--check", "--config"]
TIMEOUT_RANGE = "--timeout takes a finite number of seconds > 0 and <= 604800"
NOT_ONNX = "is not a valid ONNX model (onnx.checker: "


# Each case but the first runs the app in this process (a Python start is ~0.8 s of CPU, 50 cases); the first
# runs the real CLI, proving the process itself exits 2 with one line and no traceback.
BAD_INPUT = [
    (["native", "--model", "bert-giant"], "unknown model 'bert-giant'; valid: all-minilm-l6-v2, bert-base-uncased"),
    (["native", "--hardware", "tpu"], "unknown native hardware 'tpu'; valid: cpu, cuda"),
    (["native", "--model-families", "robots"], "unknown model family 'robots'; valid: embedding"),
    (["native", "--batch-sizes", "0"], "--batch-sizes takes whole numbers from 1 to 4,096 (got 0)"),
    (["native", "--batch-sizes", "-1"], "--batch-sizes takes whole numbers from 1 to 4,096 (got -1)"),
    (["native", "--batch-sizes", "two"], "--batch-sizes takes comma-separated integers"),
    (["native", "--engines", "tensorflow"], "unknown engine 'tensorflow'; valid: torch, onnxruntime, openvino"),
    (["native", "--precision", "fp8"], "unknown precision 'fp8'; valid: fp32"),
    (["native", "--model-path", "/nonexistent/model.onnx"], "no such file or directory"),
    # Durations: finite and in range, on every command and in the suite config.
    ([*NATIVE, "--timeout", "nan"], f"{TIMEOUT_RANGE} (got nan)"),
    ([*NATIVE, "--timeout", "inf"], f"{TIMEOUT_RANGE} (got inf)"),
    ([*NATIVE, "--timeout", "0"], f"{TIMEOUT_RANGE} (got 0)"),
    ([*NATIVE, "--min-duration", "inf"], "--min-duration takes a finite number of seconds >= 0 (got inf)"),
    ([*NATIVE, "--min-duration", "nan"], "--min-duration takes a finite number of seconds >= 0 (got nan)"),
    ([*WEB, "--timeout", "inf"], f"{TIMEOUT_RANGE} (got inf)"),
    ([*RUN, "--min-duration", "nan"], "--min-duration takes a finite number of seconds >= 0 (got nan)"),
    ([*NATIVE, "--max-time", "inf"], "--max-time takes a finite number of seconds > 0 and <= 604800 (got inf)"),
    ([*WEB, "--min-iterations", "0"], "--min-iterations takes a whole number from 1 to 1,000,000 (got 0)"),
    ([*SUITE_CHECK, "@suite.toml", "--max-time", "-1"], "--max-time takes a finite number of seconds >= 0 and"),
    ([*SUITE_CHECK, "@inf-timeout.toml"], "key 'timeout' takes a finite number of seconds > 0"),
    ([*SUITE_CHECK, "@nan.json"], "key 'min_duration_s' takes a finite number of seconds >= 0 (got nan)"),
    ([*SUITE_CHECK, "@suite.toml", "--older-than", "99999999999d"], "--older-than takes a number and a unit"),
    # An option that would do nothing with the others given.
    ([*NATIVE, "--new-tokens", "8"], "--new-tokens applies to --mode generate only (got --mode inference)"),
    ([*WEB, "--new-tokens", "8"], "--new-tokens applies to --mode generate only (got --mode inference)"),
    ([*WEB, "--mode", "training"], "--mode training: the browser runs inference, generate"),
    ([*GENERATE, "--new-tokens", "1000"], "gpt2-tiny takes 1024 positions: a prompt of 32 (--sequence-lengths)"),
    (["native", "--model", "bert-tiny", "--small-models"], "--small-models picks the tiny variant of each fam"),
    (["native", "--model-path", "@tanh.onnx", "--model", "bert-tiny"], "--model-path benchmarks that one model"),
    ([*WEB, "--webnn-device", "cpu"], "--webnn-device applies to webnn only (got --hardware wasm)"),
    (
        [*WEB, "--hardware", "webgpu", "--threads", "1,2"],
        "several --threads counts (1,2) need wasm in the web hardware",
    ),
    ([*SUITE_CHECK, "@suite.toml", "--threshold", "10%"], "--threshold applies to the comparison with --b"),
    (["suite", "--plot-only", "latest", "--models", "vision"], "--plot-only only reads the store and runs nothing"),
    # Model files.
    (["native", "--model-path", "@tanh.onnx", "--model-families", "robots"], "unknown model family 'robots'; v"),
    (["native", "--model-path", "@garbage.onnx"], NOT_ONNX),
    (["native", "--model-path", "@truncated.onnx"], NOT_ONNX),
    (["native", "--model-path", "@empty.onnx"], NOT_ONNX),
    (["native", "--model-path", "@my-model"], "cannot read config.json ('utf-8' codec can't decode byte 0x89"),
    (["native", "--model-path", "@big-model"], "config.json key 'hidden_size' must be an integer, got str \"big\""),
    (["ab", "--a", "bert-tiny", "--b", "@big-model"], "config.json key 'hidden_size' must be an integer, got str"),
    # Suite config files.
    ([*SUITE_CHECK, "@latin1.toml"], "latin1.toml is not UTF-8 text (byte 0xe9 at offset 11)"),
    ([*SUITE_CHECK, "@binary.toml"], "binary.toml is not UTF-8 text (byte 0x8b at offset 1)"),
    ([*SUITE_CHECK, "@twice.toml"], "key 'timeout' is set twice, at the top level and in [run]; keep one"),
    ([*SUITE_CHECK, "@below-header.toml"], "[model_families] holds 'batch_sizes', a top-level key"),
    ([*SUITE_CHECK, "@no-web-platforms.toml"], "include_web_platforms = true with web_platforms = []: list the"),
    ([*SUITE_CHECK, "@runs-nothing.toml"], "hardware_types = [] and include_web_platforms = false: the config run"),
    ([*WEB, "--serve", "--profile"], "--profile: not with --serve"),
    ([*WEB, "--serve", "--max-devices", "0"], "--max-devices takes a whole number from 1 to 1,000 (got 0)"),
    (
        [*WEB, "--serve", "--max-devices", "100000"],
        "--max-devices takes a whole number from 1 to 1,000 (got 100000)",
    ),
    ([*WEB, "--serve", "--devices", "40"], "--devices 40: must be 1 to --max-devices (32)"),
    ([*WEB, "--max-devices", "5"], "--max-devices: options of --serve; add --serve or drop them"),
    # A store written by a newer accelharness.
    (["report", "--db", "@newer.duckdb"], "newer.duckdb was written by a newer accelharness (schema version 99;"),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUT)
def test_bad_input_exits_2_and_writes_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    """Run in tmp_path, so every default path (the DB, the output dir) lands there: nothing may appear or change."""
    for arg in args:
        if arg.startswith("@"):
            INPUT_FILES[arg[1:]](tmp_path / arg[1:])
    before = _tree(tmp_path)
    cli = run_cli_process if args is BAD_INPUT[0][0] else run_cli
    done = cli(*(str(tmp_path / a[1:]) if a.startswith("@") else a for a in args), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert _tree(tmp_path) == before


def _tree(root: Path) -> dict[Path, bytes | None]:
    return {path: path.read_bytes() if path.is_file() else None for path in root.rglob("*")}


def test_report_for_missing_db_exits_2(tmp_path: Path) -> None:
    done = run_cli_process("report", "--db", str(tmp_path / "none.duckdb"), "--output-dir", str(tmp_path))
    assert done.returncode == 2 and "no database at" in done.stderr


def test_hardware_lists_every_seed_platform() -> None:
    done = run_cli("hardware")
    assert done.returncode == 0, done.stderr
    for platform in ("cpu", "cuda", "rocm", "mps", "openvino", "qnn", "webnn", "webgpu", "wasm"):
        assert f"│ {platform} " in done.stdout
    assert "CPU:" in done.stdout and "memory" in done.stdout
    # native WebGPU beside the page's, and what ORT's own discovery offers (plugin EPs registered)
    assert "│ webgpu (native) " in done.stdout and "onnxruntime.get_ep_devices" in done.stdout
    assert "│ CPUExecutionProvider " in done.stdout
    if importlib.util.find_spec("onnxruntime_ep_webgpu") is not None:
        assert "│ WebGpuExecutionProvider " in done.stdout


def test_any_onnx_file_runs_with_inputs_from_its_signature(tmp_path: Path) -> None:
    model = tmp_path / "tanh.onnx"
    _tiny_onnx(model)
    db = tmp_path / "file.duckdb"
    done = run_cli(
        "native",
        "--model-path",
        str(model),
        "--hardware",
        "cpu,openvino",
        "--batch-sizes",
        "3",
        "--sequence-lengths",
        "7",
        *QUICK,
        "--db",
        str(db),
        "--no-reports",  # no report is read here (each costs seconds)
        "--output-dir",
        str(tmp_path / "o"),
    )
    assert done.returncode == 0, done.stderr
    by_engine = {r["engine"]: r for r in rows(db)}
    assert by_engine["torch"]["status"] == "unsupported"
    assert "not applicable" in by_engine["torch"]["error"]
    for engine in ("onnxruntime", "openvino"):
        assert by_engine[engine]["status"] == "ok", by_engine[engine]["error"]
        assert '"input_shapes": {"x": [3, 7]}' in by_engine[engine]["details"]
        assert '"reference": "onnxruntime-cpu-fp32"' in by_engine[engine]["details"]


def test_local_model_directory_is_pretrained(tmp_path: Path) -> None:
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(1)
    BertModel(
        BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, vocab_size=500)
    ).save_pretrained(tmp_path / "my-bert")
    db = tmp_path / "dir.duckdb"
    done = run_cli(
        "native",
        "--model-path",
        str(tmp_path / "my-bert"),
        "--engines",
        "torch,onnxruntime",
        "--sequence-lengths",
        "8",
        *QUICK,
        "--db",
        str(db),
        "--no-reports",  # no report is read here (each costs seconds)
        "--output-dir",
        str(tmp_path / "o"),
    )
    assert done.returncode == 0, done.stderr
    results = rows(db)
    assert {r["weights"] for r in results} == {"pretrained"}
    assert {r["status"] for r in results} == {"ok"}
    assert {r["model"] for r in results} == {"my-bert"}


def test_summary_table_carries_the_reports_warnings() -> None:
    """The table printed after a run flags what the reports flag: a software WebGPU adapter, a changed precision."""
    from rich.console import Console

    from harness.cli.progress import summary_table
    from harness.core.records import Case, Result, Target

    webgpu = Target("webgpu", "onnxruntime-web", "webgpu")
    openvino = Target("openvino", "openvino", "CPU")
    steady = [2.0, 2.01, 1.99, 2.0]
    results = [
        Result("bert-tiny", "embedding", "random", webgpu, Case(1, 32, "fp32"), "ok", samples_ms=steady,
               details={"fallback_adapter": True}),
        Result("bert-tiny", "embedding", "random", openvino, Case(1, 32, "fp16"), "ok", samples_ms=steady,
               precision="fp32"),
    ]  # fmt: skip
    console = Console(width=400, record=True)
    console.print(summary_table(results))
    webgpu_line, openvino_line = [line for line in console.export_text().splitlines() if "bert-tiny" in line]
    assert "WebGPU on a software (fallback) adapter" in webgpu_line
    assert "ran fp32 (asked fp16)" in openvino_line and "noisy" not in openvino_line


@pytest.fixture
def read_only_dir(tmp_path: Path):
    """A directory no one may write in, root included: a read-only tmpfs (needs CAP_SYS_ADMIN, as root in CI)."""
    mount = tmp_path / "read-only"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        mount.chmod(0o555)  # enough for anyone but root
        if os.access(mount, os.W_OK):
            pytest.skip(f"cannot make a read-only directory here: {made.stderr.decode().strip()}")
    yield mount
    if made.returncode == 0:
        subprocess.run(["umount", "-l", str(mount)], check=False)
    else:
        mount.chmod(0o755)  # so pytest can remove tmp_path


READ_ONLY = "is not writable (Read-only file system)"


# The first case runs the real CLI, the others the app in this process (as BAD_INPUT's).
BAD_OUTPUT = [
    ([*NATIVE, "--output-dir", "@notes.txt"], "--output-dir @notes.txt: @notes.txt is a file, not a directory"),
    ([*NATIVE, "--output-dir", "@notes.txt/reports"], "@notes.txt is a file, not a directory; nothing was run"),
    ([*NATIVE, "--output-dir", "@read-only/reports"], "--output-dir @read-only/reports: @read-only "),
    ([*WEB, "--output-dir", "@notes.txt"], "--output-dir @notes.txt: @notes.txt is a file, not a directory"),
    ([*NATIVE, "--db", "@read-only/bench.duckdb"], "--db @read-only/bench.duckdb: @read-only "),
    (["ab", "--a", "bert-tiny", "--b", "bert-tiny", "--out", "@read-only/v.md"], "--out @read-only/v.md: @read-o"),
    (["ab", "--a", "bert-tiny", "--b", "bert-tiny", "--out", "@notes.txt/v.md"], "@notes.txt is a file, not a"),
    (["suite", "--config", "@suite.toml", "--output-dir", "@notes.txt"], "output_dir @notes.txt: @notes.txt is a"),
    (["export", "--db", "@store.duckdb", "--out", "@notes.txt"], "--out @notes.txt: @notes.txt is a file, not a"),
]


@pytest.mark.parametrize(("args", "message"), BAD_OUTPUT)
def test_bad_output_paths_are_refused_before_anything_runs(
    tmp_path: Path, read_only_dir: Path, args: list[str], message: str
) -> None:
    """An output path that cannot be written is found out before a run exists (it once cost the whole run,
    then a traceback): exit 2, one line, no DB created, every file as it was."""
    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "suite.toml").write_text(SUITE)
    with open_store(tmp_path / "store.duckdb"):
        pass
    before = _tree(tmp_path)
    cli = run_cli_process if args is BAD_OUTPUT[0][0] else run_cli
    done = cli(*(a.replace("@", f"{tmp_path}/") for a in args), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    stderr = " ".join(done.stderr.split())
    assert message.replace("@", f"{tmp_path}/") in stderr, stderr
    if "read-only" in message:
        assert READ_ONLY in stderr or "Permission denied" in stderr, stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert _tree(tmp_path) == before  # no accelharness.duckdb, no report, the notes byte-identical


def test_a_machine_without_an_engines_library_runs_the_others(tmp_path: Path) -> None:
    """A GPU image with torch and ONNX Runtime but no OpenVINO (found on a lent H200): the machine's probe
    imported every engine's module, and the missing `openvino` took every command down with a traceback.
    Now the engine probes unavailable with the reason and the others run."""
    hidden = tmp_path / "hidden"
    (hidden / "openvino").mkdir(parents=True)
    (hidden / "openvino" / "__init__.py").write_text("raise ImportError('openvino hidden by the test')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(hidden), os.environ.get("PYTHONPATH", "")])}
    shown = run_cli_process("hardware", env=env)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    table = " ".join(shown.stdout.replace("│", " ").split())  # a reason the table wrapped, on one line
    assert "openvino is not installed here (openvino hidden by the test)" in table
    db = tmp_path / "h.duckdb"
    done = run_cli_process("native", "--model", "bert-tiny", "--engines", "onnxruntime", "--hardware", "cpu",
                   "--batch-sizes", "1", "--sequence-lengths", "8", *QUICK, "--db", str(db),
                   "--no-reports", "--output-dir", str(tmp_path / "out"), env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "ok" in done.stdout and "Traceback" not in done.stderr
