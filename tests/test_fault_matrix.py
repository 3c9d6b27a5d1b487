"""The fault matrix: each fault driven for real; the message, the exit code, and nothing completed lost.

Browser faults (crash, page hang, page JS error) are in test_web.py (test_faults_leave_rows_and_the_run_goes_on),
bad CLI values (unknown model/hardware, batch 0/-1) in test_cli.py; docs/reliability.md lists them all.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import duckdb
import numpy as np
import onnx
import psutil
import pytest
from conftest import CLI, QUICK, run_cli, run_cli_process
from onnx import helper
from test_native_run import rows
from test_suite import small_config

from harness.prepare.prepared import PrepareJob
from harness.prepare.specs import load_specs
from harness.run.worker import GRANDCHILD_MARK, prepare_isolated

# One run, four workers failing for real side by side (a fault each), torch's jobs between them:
# every failed job's rows carry its own status and cause, and every other job completes.
FAULTS = {
    ("bert-tiny", "onnxruntime"): ("segfault", "error", "SIGSEGV"),
    ("bert-tiny", "openvino"): ("abort", "error", "SIGABRT"),
    ("vit-tiny", "onnxruntime"): ("oom", "oom", "MemoryError"),
    # a hang whose worker started a process of its own: at the timeout the whole process group goes
    ("vit-tiny", "openvino"): ("grandchild", "timeout", "no result within --timeout 20s"),
}


def test_worker_faults_are_recorded_and_other_jobs_complete(tmp_path: Path) -> None:
    db = tmp_path / "f.duckdb"
    args = ["native", "--model", "bert-tiny,vit-tiny", "--engines", "torch,onnxruntime,openvino"]
    args += ["--hardware", "cpu,openvino", "--batch-sizes", "1,2", "--sequence-lengths", "16", *QUICK]
    args += ["--timeout", "20", "--db", str(db), "--no-reports", "--output-dir", str(tmp_path)]
    inject = ",".join(f"{kind}:{model}:{engine}" for (model, engine), (kind, _, _) in FAULTS.items())
    running = CliProcess(*args, env={"ACCELHARNESS_INJECT_FAULT": inject})
    grandchild = _descendant_with(running, GRANDCHILD_MARK)
    assert running.process.wait(600) == 0, "".join(running.lines)
    _gone, alive = psutil.wait_procs([grandchild], timeout=10)
    try:
        assert not alive, f"{grandchild} outlived its worker's timeout"
    finally:
        for process in alive:
            process.kill()
    results = rows(db)
    for (model, engine), (_, status, message) in FAULTS.items():
        failed = [r for r in results if (r["model"], r["engine"]) == (model, engine)]
        assert [r["status"] for r in failed] == [status, status], (model, engine, failed[0]["error"])
        assert all(message in r["error"] for r in failed), failed[0]["error"]
        assert all(r["iterations"] is None for r in failed)  # no number was invented for them
    assert [r["status"] for r in results if r["engine"] == "torch"] == ["ok"] * 4
    assert rows(db, "SELECT status FROM runs")[0]["status"] == "completed"


def run_bert_on_ort(db: Path, output_dir: Path) -> subprocess.CompletedProcess:
    """The smallest real native run: bert-tiny on ONNX Runtime CPU."""
    where = ["--db", str(db), "--output-dir", str(output_dir)]
    return run_cli("native", "--model", "bert-tiny", "--engines", "onnxruntime", *QUICK, *where)


# A script's `cmd &`: a shell without job control starts the job with SIGINT ignored (the shell itself
# ignores it too here, so its exit status is the job's).
BACKGROUND_JOB = 'trap "" INT; "$@" & wait $!'


class CliProcess:
    """A real `accelharness …` in its own process group, its output lines collected as they come;
    `background_job`: started as a script's background job (`setsid sh -c 'accelharness … &'`)."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, background_job: bool = False) -> None:
        self.lines: list[str] = []
        command = [*CLI, *args]
        self.process = subprocess.Popen(
            ["sh", "-c", BACKGROUND_JOB, "sh", *command] if background_job else command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def wait_for(self, text: str, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in line for line in self.lines):
            assert self.process.poll() is None, "".join(self.lines)
            assert time.monotonic() < deadline, f"no '{text}' within {timeout_s}s:\n" + "".join(self.lines)
            time.sleep(0.2)


# bert-tiny's rows land, then vit-tiny's worker hangs. Torch where the stop must also end torch's fork server
# and the worker forked from it (kill -9 and SIGTERM of the CLI alone); ONNX Runtime's spawned workers
# elsewhere (a signal to the whole group, a full disk): torch's fork server costs ~5 s of CPU per command.
HANG_VIT_ON_TORCH = {"ACCELHARNESS_INJECT_FAULT": "hang:vit-tiny:torch"}
HANG_VIT_ON_ORT = {"ACCELHARNESS_INJECT_FAULT": "hang:vit-tiny:onnxruntime"}
TORCH, ORT = ("torch",), ("onnxruntime",)
NO_PLOTS = "generate_plots = false"  # the suites' reports are not read here: no plots drawn (~1.5 s each)


def _hang_on(engines: tuple[str, ...]) -> dict[str, str]:
    return HANG_VIT_ON_TORCH if engines[0] == "torch" else HANG_VIT_ON_ORT


def _stop_then_resume(
    tmp_path: Path, stop: signal.Signals, web: bool, engines: tuple[str, ...]
) -> tuple[list[dict], list[dict]]:
    """Start a suite, stop it with `stop` once bert-tiny's rows (one per engine) are stored, then --resume it."""
    config = small_config(tmp_path, web=web, engines=engines, extra=NO_PLOTS)
    stored, total = len(engines), 2 * len(engines) + (2 if web else 0)
    running = CliProcess("suite", "--config", str(config), env=_hang_on(engines))
    running.wait_for(f"[{stored}/{total}] stored")
    time.sleep(2)  # the vit-tiny torch worker is hanging now
    workers = psutil.Process(running.process.pid).children(recursive=True)
    if stop == signal.SIGINT:  # Ctrl-C: the terminal signals the whole foreground process group
        os.killpg(running.process.pid, signal.SIGINT)
        assert running.process.wait(60) == 130
        assert "--resume" in "".join(running.lines)
    else:  # kill -9 of the CLI alone: its workers must not outlive it (PR_SET_PDEATHSIG)
        running.process.kill()
        running.process.wait(60)
        _gone, alive = psutil.wait_procs(workers, timeout=10)
        assert not alive, f"orphan workers: {alive}"
    before = rows(tmp_path / "t.duckdb", "SELECT * FROM results ORDER BY created_at")
    assert [r["model"] for r in before] == ["bert-tiny"] * stored
    resumed = CliProcess("suite", "--config", str(config), "--resume")
    assert resumed.process.wait(600) == 0, "".join(resumed.lines)
    assert f"{total - stored} results still to run" in "".join(resumed.lines)
    return before, rows(tmp_path / "t.duckdb", "SELECT * FROM results ORDER BY created_at")


def test_ctrl_c_then_resume_completes_without_duplicates(tmp_path: Path) -> None:
    before, after = _stop_then_resume(tmp_path, signal.SIGINT, web=True, engines=ORT)
    assert len(after) == 4 and len({r["result_key"] for r in after}) == 4
    assert [r["result_id"] for r in after[:1]] == [r["result_id"] for r in before]  # kept, not re-measured
    assert {r["engine"] for r in after} == {"onnxruntime", "onnxruntime-web"}
    runs = rows(tmp_path / "t.duckdb", "SELECT status FROM runs")
    assert runs == [{"status": "completed"}]  # the interrupted run was continued, not a second one


def test_kill_9_then_resume_completes_without_duplicates(tmp_path: Path) -> None:
    before, after = _stop_then_resume(tmp_path, signal.SIGKILL, web=False, engines=TORCH)
    assert len(after) == 2 and len({r["result_key"] for r in after}) == 2
    assert [r["result_id"] for r in after[:1]] == [r["result_id"] for r in before]
    assert all(r["status"] == "ok" for r in after)
    assert rows(tmp_path / "t.duckdb", "SELECT status FROM runs") == [{"status": "completed"}]


def test_native_ctrl_c_then_resume_continues_the_same_run(tmp_path: Path) -> None:
    """`accelharness native --resume` (no suite): the same options continue the interrupted run."""
    db = tmp_path / "n.duckdb"
    args = ["native", "--model", "bert-tiny,vit-tiny", "--engines", "onnxruntime", "--hardware", "cpu"]
    args += [*QUICK, "--batch-sizes", "1", "--sequence-lengths", "16", "--db", str(db), "--no-reports"]
    args += ["--output-dir", str(tmp_path)]
    running = CliProcess(*args, env=HANG_VIT_ON_ORT)
    running.wait_for("[1/2] stored")
    time.sleep(2)
    os.killpg(running.process.pid, signal.SIGINT)
    assert running.process.wait(60) == 130
    assert "--resume" in "".join(running.lines)
    before = rows(db, "SELECT * FROM results ORDER BY created_at")
    assert [r["model"] for r in before] == ["bert-tiny"]
    # other options (one model, batch 2: the smallest run that differs) start a new run
    other = ["native", "--model", "bert-tiny", "--engines", "onnxruntime", "--hardware", "cpu", *QUICK]
    other += ["--batch-sizes", "2", "--sequence-lengths", "16"]
    different = run_cli(*other, "--db", str(db), "--no-reports", "--output-dir", str(tmp_path), "--resume")
    assert different.returncode == 0 and "starting a new run" in different.stdout, different.stderr
    resumed = run_cli(*args, "--resume")
    assert resumed.returncode == 0 and "1 results still to run" in resumed.stdout, resumed.stderr
    runs = rows(db, "SELECT run_id, status FROM runs ORDER BY started_at")
    assert [r["status"] for r in runs] == ["completed", "completed"]  # resumed one, and the other run
    first = [r for r in rows(db, "SELECT * FROM results ORDER BY created_at") if r["run_id"] == runs[0]["run_id"]]
    assert len(first) == len({r["result_key"] for r in first}) == 2
    assert [r["result_id"] for r in first[:1]] == [r["result_id"] for r in before]


def _stop_native_then_resume(
    tmp_path: Path, stop: signal.Signals, background_job: bool, engines: tuple[str, ...]
) -> None:
    """Stop `accelharness native` with `stop` once bert-tiny's rows (one per engine) are stored (vit-tiny's
    worker on the first engine hangs), then run the command it prints to continue: the rest, once each, in the
    same run."""
    db = tmp_path / "s.duckdb"
    args = ["native", "--model", "bert-tiny,vit-tiny", "--engines", ",".join(engines), "--hardware", "cpu"]
    args += [*QUICK, "--batch-sizes", "1", "--sequence-lengths", "16", "--db", str(db), "--no-reports"]
    args += ["--output-dir", str(tmp_path)]
    stored, total = len(engines), 2 * len(engines)
    running = CliProcess(*args, env=_hang_on(engines), background_job=background_job)
    running.wait_for(f"[{stored}/{total}] stored")
    time.sleep(2)  # the vit-tiny worker is hanging now
    processes = psutil.Process(running.process.pid).children(recursive=True)
    if background_job:  # kill -INT -PGID: the job's whole group
        os.killpg(running.process.pid, stop)
    else:  # kill PID: the CLI alone
        running.process.send_signal(stop)
    assert running.process.wait(60) == 128 + stop, "".join(running.lines)
    _gone, alive = psutil.wait_procs(processes, timeout=10)
    assert not alive, f"left running: {alive}"
    assert rows(db, "SELECT status FROM runs") == [{"status": "interrupted"}]
    before = rows(db, "SELECT * FROM results ORDER BY created_at")
    assert [r["model"] for r in before] == ["bert-tiny"] * stored
    (hint,) = [line for line in running.lines if "continue with: " in line]
    assert f"interrupted by {stop.name}" in hint
    continued = shlex.split(hint.split("continue with: ", 1)[1])
    assert continued == ["accelharness", *args, "--resume"]
    resumed = run_cli(*continued[1:])
    assert resumed.returncode == 0 and f"{total - stored} results still to run" in resumed.stdout, resumed.stderr
    after = rows(db, "SELECT * FROM results ORDER BY created_at")
    assert len(after) == len({r["result_key"] for r in after}) == total
    assert [r["result_id"] for r in after[:stored]] == [r["result_id"] for r in before]  # kept, not re-measured
    assert rows(db, "SELECT status FROM runs") == [{"status": "completed"}]


def test_sigterm_is_handled_as_ctrl_c_then_resume_completes(tmp_path: Path) -> None:
    """`kill PID` (SIGTERM) of `native`: exit 143, the run `interrupted`, the workers gone, the command
    to continue printed; that command finishes the run without a duplicate."""
    _stop_native_then_resume(tmp_path, signal.SIGTERM, background_job=False, engines=TORCH)


def test_sigint_reaches_a_background_job_then_resume_completes(tmp_path: Path) -> None:
    """Started as a script's background job (SIGINT ignored on entry), `native` still takes `kill -INT`
    to its group: exit 130, the run `interrupted`, then the printed command finishes it."""
    _stop_native_then_resume(tmp_path, signal.SIGINT, background_job=True, engines=ORT)


def test_second_writer_is_told_who_holds_the_db(tmp_path: Path) -> None:
    db = tmp_path / "held.duckdb"
    duckdb.connect(str(db)).close()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import duckdb, time; c = duckdb.connect({str(db)!r}); print('held', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        done = run_bert_on_ort(db, tmp_path / "out")
        assert done.returncode == 2, done.stderr
        assert f"is locked by PID {holder.pid}" in done.stderr
    finally:
        holder.kill()
        holder.wait()
    assert rows(db, "SELECT count(*) AS n FROM information_schema.tables")[0]["n"] == 0  # nothing written


def test_corrupt_db_exits_2_and_is_left_alone(tmp_path: Path) -> None:
    db = tmp_path / "corrupt.duckdb"
    db.write_bytes(b"not a database" * 64)
    done = run_bert_on_ort(db, tmp_path)
    assert done.returncode == 2 and "cannot open" in done.stderr, done.stderr
    assert db.read_bytes() == b"not a database" * 64


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("bad.toml", "batch_sizes = [1,", "is not valid TOML"),
        ("bad.json", '{"batch_sizes": [1]', "is not valid JSON"),
        ("typo.toml", "batch_size = [1]", "unknown key 'batch_size'; valid keys: name, batch_sizes"),
        ("type.toml", 'batch_sizes = "1"', "key 'batch_sizes' must be list, got str"),
        ("bool.toml", "timeout = true", "key 'timeout' must be float, got bool"),
        ("hw.toml", '[hardware]\nhardware_types = ["tpu"]', "key 'hardware_types': unknown value 'tpu'; valid: cpu"),
        ("model.toml", '[model_families]\nvision = ["vit-huge"]', "unknown model 'vit-huge'; valid: "),
        ("family.toml", '[model_families]\nrobots = ["vit-tiny"]', "unknown family 'robots'; valid: embedding"),
        ("zero.toml", "batch_sizes = [0]", "key 'batch_sizes' takes whole numbers from 1 to 4,096 (got 0)"),
        ("mode.toml", 'modes = ["chat"]', "key 'modes': unknown value 'chat'; valid: inference, generate, training"),
        (
            "tokens.toml",
            'modes = ["generate"]\nnew_tokens = 5000',
            "key 'new_tokens' takes a whole number from 1 to 4,096 (got",
        ),
        ("nomode.toml", "modes = []", "key 'modes' is empty; valid: inference, generate, training"),
        ("train.toml", 'modes = ["training"]', "include_web_platforms = true: the browser runs inference, generate"),
        ("lonely.toml", "new_tokens = 4", "key 'new_tokens' applies to generate only"),
        (
            "context.toml",
            'modes = ["generate"]\nsequence_lengths = [1000]\nnew_tokens = 32',
            "gpt2-tiny takes 1024 positions: a prompt of 1000 (key 'sequence_lengths') plus key 'new_tokens' 32",
        ),
    ],
)
def test_malformed_config_exits_2_naming_file_and_key(tmp_path: Path, name: str, text: str, message: str) -> None:
    config = tmp_path / name
    config.write_text(text + f'\n[run]\ndb = "{tmp_path / "x.duckdb"}"\n' if name.endswith(".toml") else text)
    # One case as a real process (exit 2, no traceback); the others, refused before any run, in this one.
    cli = run_cli_process if name == "bad.toml" else run_cli
    done = cli("suite", "--config", str(config), "--check")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert str(config) in done.stderr and message in " ".join(done.stderr.split()), done.stderr
    assert not (tmp_path / "x.duckdb").exists()


def test_unsupported_operator_is_recorded_per_engine(tmp_path: Path) -> None:
    """A graph with an operator no engine has: each engine's own message, status unsupported."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 8])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 8])
    nodes = [helper.make_node("Relu", ["x"], ["h"]), helper.make_node("NoSuchOp", ["h"], ["y"], domain="com.example")]
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.example", 1)]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=opsets, ir_version=10)
    onnx.save(model, tmp_path / "custom.onnx")
    db = tmp_path / "u.duckdb"
    done = run_cli(
        "native",
        "--model-path",
        str(tmp_path / "custom.onnx"),
        "--engines",
        "onnxruntime,openvino",
        "--hardware",
        "cpu,openvino",
        *QUICK,
        "--db",
        str(db),
        "--no-reports",
        "--output-dir",
        str(tmp_path / "out"),
    )
    assert done.returncode == 0, done.stderr
    found = {r["engine"]: r for r in rows(db)}
    assert found["onnxruntime"]["status"] == "unsupported" and "NoSuchOp" in found["onnxruntime"]["error"]
    assert found["openvino"]["status"] == "unsupported" and "No conversion rule" in found["openvino"]["error"]


def overflowing_layernorm(path: Path) -> Path:
    """y = LayerNorm(x·1e4·1e4): finite in fp32; in fp16 the 1e8-sized input is inf before ORT's CPU
    LayerNormalization (a real fp16 kernel there), so every output is NaN."""
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 8])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 8])
    scale = onnx.numpy_helper.from_array(np.full([8], 1e4, np.float32), "scale")
    gamma = onnx.numpy_helper.from_array(np.ones([8], np.float32), "gamma")
    nodes = [
        helper.make_node("Mul", ["x", "scale"], ["a"]),
        helper.make_node("Mul", ["a", "scale"], ["b"]),
        helper.make_node("LayerNormalization", ["b", "gamma"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(nodes, "overflow", [x], [y], [scale, gamma])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10), path)
    return path


def test_nan_outputs_are_a_mismatch_naming_the_output(tmp_path: Path) -> None:
    """A real fp16 ONNX Runtime run whose outputs are all NaN while the fp32 reference is finite:
    `mismatch`, the output named and its non-finite values counted, no max_abs_diff invented."""
    model = overflowing_layernorm(tmp_path / "overflow.onnx")
    db = tmp_path / "n.duckdb"
    where = ["--db", str(db), "--no-reports", "--output-dir", str(tmp_path / "out")]
    done = run_cli(
        "native", "--model-path", str(model), "--engines", "onnxruntime", "--hardware", "cpu",
        "--precision", "fp32,fp16", "--batch-sizes", "2", *QUICK, *where,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = {r["precision"]: r for r in rows(db)}
    assert found["fp32"]["status"] == "ok", found["fp32"]["error"]
    fp16 = found["fp16"]
    assert fp16["status"] == "mismatch", fp16
    assert fp16["error"] == "output 'y': 16 of 16 values non-finite (16 NaN, 0 inf) where the reference is finite"
    assert fp16["max_abs_diff"] is None and fp16["max_rel_diff"] is None
    details = json.loads(fp16["details"])
    assert details["non_finite_outputs"] == [{"output": "y", "size": 16, "nan": 16, "inf": 0, "against_non_finite": 0}]
    assert fp16["iterations"] >= 5  # the latencies were measured; the row says they belong to a wrong answer
    # --no-reports: the run's output directory holds the matrix, and no report or plot
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [f"compatibility_matrix.{x}" for x in ("json", "md")]


@pytest.fixture
def full_disk(tmp_path: Path):
    """A 256 KiB tmpfs filled to the brim (needs CAP_SYS_ADMIN, as root in CI's container)."""
    mount = tmp_path / "full"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here to fill: {made.stderr.decode().strip()}")
    try:
        filler = open(mount / "filler", "wb")  # noqa: SIM115 - its close fails too, on a full disk
        with pytest.raises(OSError, match="No space left"):
            while True:
                filler.write(b"\0" * 4096)
                filler.flush()
        with contextlib.suppress(OSError):
            filler.close()
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_full_output_dir_keeps_the_results(tmp_path: Path, full_disk: Path) -> None:
    db = tmp_path / "d.duckdb"
    done = run_bert_on_ort(db, full_disk / "reports")
    assert done.returncode == 1, done.stdout + done.stderr
    stderr = " ".join(done.stderr.split())
    assert "No space left on device" in stderr and "accelharness report --run" in stderr, done.stderr
    assert [r["status"] for r in rows(db)] == ["ok"]
    assert rows(db, "SELECT status FROM runs") == [{"status": "completed"}]


def _fill(mount: Path) -> None:
    """Fill `mount` to the brim (4 KiB at a time, as a busy disk is found full)."""
    with contextlib.suppress(OSError), open(mount / "filler", "wb") as filler:  # its close fails too, on a full disk
        while True:
            filler.write(b"\0" * 4096)
            filler.flush()


def test_disk_full_under_the_db_stops_the_run_in_one_line_and_keeps_its_rows(tmp_path: Path) -> None:
    """The DB's disk fills up mid-run (after the first row, while the next job's worker starts): one
    line naming the file, the disk and the OS's reason, not DuckDB's two chained tracebacks; exit 1,
    the run `interrupted` (where that last small write still fits), the finished row kept; once space
    is freed, the printed command finishes the run."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here to fill: {made.stderr.decode().strip()}")
    try:
        db = mount / "d.duckdb"
        args = ["native", "--model", "bert-tiny,vit-tiny", "--engines", "onnxruntime", "--hardware", "cpu"]
        args += [*QUICK, "--batch-sizes", "1", "--sequence-lengths", "16"]
        args += ["--db", str(db), "--no-reports", "--output-dir", str(tmp_path / "out")]
        running = CliProcess(*args)
        running.wait_for("[1/2] stored")
        _fill(mount)
        assert running.process.wait(120) == 1, "".join(running.lines)
        output = "".join(running.lines)
        assert "Traceback" not in output and "TransactionException" not in output, output
        (line,) = [line for line in running.lines if "cannot write to" in line]
        assert f"cannot write to {db}: " in line and "No space left on device" in line, line
        assert f"the disk mounted at {mount} has 0.0 MiB free" in line and "free space, then continue with:" in line
        (mount / "filler").unlink()
        # Marking the run is one more small write, which a disk full to the last byte refuses too: then the
        # line says so, and the run stays `running`, as after kill -9 (--resume continues both alike).
        (run,) = rows(db, "SELECT status FROM runs")
        unmarked = "the run could not be marked interrupted either and stays running" in line
        assert run["status"] == ("running" if unmarked else "interrupted"), line
        before = rows(db, "SELECT * FROM results ORDER BY created_at")
        assert [(r["model"], r["engine"], r["status"]) for r in before] == [("bert-tiny", "onnxruntime", "ok")]
        resumed = run_cli(*shlex.split(line.split("continue with: ", 1)[1])[1:])
        assert resumed.returncode == 0 and "1 results still to run" in resumed.stdout, resumed.stderr
        after = rows(db, "SELECT * FROM results ORDER BY created_at")
        assert len(after) == len({r["result_key"] for r in after}) == 2
        assert rows(db, "SELECT status FROM runs") == [{"status": "completed"}]
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_db_init_overwrite_refuses_a_file_in_use(tmp_path: Path) -> None:
    """`db init --overwrite` takes the file's lock before deleting anything: held by another process, it
    refuses (exit 2, naming that process) and the holder's data stays; free, it starts an empty file."""
    db = tmp_path / "held.duckdb"
    holding = (
        f"import duckdb, time; c = duckdb.connect({str(db)!r}); c.execute('CREATE TABLE mine AS SELECT 42 AS x');"
        " print('held', flush=True); time.sleep(120)"
    )
    holder = subprocess.Popen([sys.executable, "-c", holding], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        refused = run_cli("db", "init", "--overwrite", "--db", str(db))
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"is locked by PID {holder.pid}" in " ".join(refused.stderr.split()), refused.stderr
    finally:
        holder.kill()
        holder.wait()
    assert rows(db, "SELECT x FROM mine") == [{"x": 42}]  # the holder's data is still there
    done = run_cli("db", "init", "--overwrite", "--db", str(db))
    assert done.returncode == 0, done.stderr
    assert rows(db, "SELECT count(*) AS n FROM information_schema.tables WHERE table_name = 'mine'") == [{"n": 0}]


def test_ctrl_c_in_a_parallel_suite_records_no_interrupt_then_resume_runs_the_rest(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Two device groups (cpu, and cuda whose rows say it is absent) in two threads. Ctrl-C stops both:
    no row says KeyboardInterrupt, no worker or worker log is left, the run is `interrupted`, and
    --resume runs exactly the keys without a row."""
    config = small_config(tmp_path, hardware=("cpu", "cuda"), engines=ORT, extra=NO_PLOTS)
    # A TMPDIR of its own, where the workers' logs are looked for afterwards; short, as a torch run's would
    # need: multiprocessing's forkserver binds an AF_UNIX socket in it (at most 107 bytes), and
    # pytest-xdist's tmp_path (…/popen-gw0/test_ctrl_c_in_a_parallel_suit0/) is too long for that.
    temp = Path(tempfile.mkdtemp(prefix="ah-"))
    request.addfinalizer(lambda: shutil.rmtree(temp, ignore_errors=True))
    running = CliProcess("suite", "--config", str(config), env={**HANG_VIT_ON_ORT, "TMPDIR": str(temp)})
    running.wait_for("stored bert-tiny cpu/onnxruntime")  # next on the host group: vit-tiny, hanging
    time.sleep(3)
    processes = psutil.Process(running.process.pid).children(recursive=True)
    os.killpg(running.process.pid, signal.SIGINT)
    assert running.process.wait(60) == 130, "".join(running.lines)
    _gone, alive = psutil.wait_procs(processes, timeout=10)
    assert not alive, f"left running: {alive}"
    assert not list(temp.glob("accelharness-worker-*")), list(temp.iterdir())
    db = tmp_path / "t.duckdb"
    assert rows(db, "SELECT status FROM runs") == [{"status": "interrupted"}]
    before = rows(db, "SELECT * FROM results")
    assert {r["status"] for r in before} <= {"ok", "unsupported"}, [r["error"] for r in before]
    resumed = CliProcess("suite", "--config", str(config), "--resume")
    assert resumed.process.wait(600) == 0, "".join(resumed.lines)
    assert f"{6 - len(before)} results still to run" in "".join(resumed.lines)
    after = rows(db, "SELECT * FROM results")
    assert len(after) == len({r["result_key"] for r in after}) == 6  # cpu: 2 models; cuda: 2 models × 2 EPs
    assert [r["status"] for r in after if r["hardware"] == "cpu"] == ["ok"] * 2
    assert not any("KeyboardInterrupt" in (r["error"] or "") for r in after)
    assert rows(db, "SELECT status FROM runs") == [{"status": "completed"}]


def _descendant_with(running: CliProcess, mark: str, timeout_s: float = 300) -> psutil.Process:
    """The process with `mark` in its command line that the running CLI started, directly or not."""
    deadline = time.monotonic() + timeout_s
    while running.process.poll() is None and time.monotonic() < deadline:
        for process in psutil.Process(running.process.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if mark in process.cmdline():
                    return process
        time.sleep(0.2)
    raise AssertionError(f"no process '{mark}' under the CLI:\n" + "".join(running.lines))


def test_what_a_worker_started_dies_with_the_killed_cli(tmp_path: Path) -> None:
    """The worker's whole process group goes when the CLI itself is killed with -9: a process the
    engine started (the `grandchild` fault) too. (At a timeout: test_worker_faults_are_recorded_….)"""
    prepared, _ = prepare_isolated(PrepareJob(load_specs()["bert-tiny"], [(1, 32)]), 600)
    assert prepared is not None  # in the export cache now: the worker reaches the fault at once
    where = ["--db", str(tmp_path / "g.duckdb"), "--no-reports", "--output-dir", str(tmp_path / "out")]
    args = ["native", "--model", "bert-tiny", "--engines", "onnxruntime", *QUICK, "--timeout", "20", *where]
    running = CliProcess(*args, env={"ACCELHARNESS_INJECT_FAULT": "grandchild:bert-tiny:onnxruntime"})
    grandchild = _descendant_with(running, GRANDCHILD_MARK)
    running.process.kill()
    running.process.wait(60)
    _gone, alive = psutil.wait_procs([grandchild], timeout=10)
    try:
        assert not alive, f"{grandchild} outlived its worker"
    finally:
        for process in alive:
            process.kill()
