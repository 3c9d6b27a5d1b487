"""One variant of an `accelharness ab` run, in its own process: loaded once, measured on command.

The parent (harness.ab.run) starts `python -m harness.ab.worker JOB` with the interpreter of the
variant's environment (--a-python/--b-python: e.g. another onnxruntime release), JOB being the
pickled VariantJob. Commands arrive as JSON lines on stdin; each gets one JSON line back on the
process's original stdout. Anything an engine prints goes to stderr (the parent's log of the
worker), never into the replies. A command that fails is answered with its status and reason;
the process stays up for the next one.

  {"op": "load"}                                 -> precision that ran, load_ms, the session's facts
  {"op": "warmup", "case": i, "iterations": n}   -> first_run_ms (the case's first, timed, run)
  {"op": "block", "case": i, "iterations": n, "seconds": s, "parity": bool}
                                                 -> samples_ms (>= n iterations and >= s seconds),
                                                    load_avg_1m, cpu_percent [, parity fields]
"""

from __future__ import annotations

import json
import os
import pickle
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.records import Case, Target
from harness.prepare.prepared import PreparedModel


@dataclass(frozen=True)
class VariantJob:
    prepared: PreparedModel
    target: Target
    precision: str
    cases: list[Case]


class VariantServer:
    """The variant's session and what the commands do with it."""

    def __init__(self, job: VariantJob) -> None:
        from harness.native import get_backend
        from harness.run.memory import PeakRss

        self.job = job
        self.backend = get_backend(job.target.engine)
        self.session: Any = None
        self.rss = PeakRss()

    def handle(self, command: dict[str, Any]) -> dict[str, Any]:
        op = command["op"]
        if op == "load":
            return self.load()
        case = self.job.cases[command["case"]]
        if op == "warmup":
            return self.warmup(case, command["iterations"])
        if op == "block":
            return self.block(case, command["iterations"], command["seconds"], command["parity"])
        raise ValueError(f"unknown command {op!r}")

    def load(self) -> dict[str, Any]:
        from harness.native.base import LoadRequest
        from harness.run.worker import inject_fault

        job = self.job
        inject_fault(job)  # ACCELHARNESS_INJECT_FAULT: the tests' crash and hang on purpose, as in run_job
        first = job.cases[0]
        example, _ = job.prepared.load_case((first.batch_size, first.seq_len))
        started = time.perf_counter()
        self.session = self.backend.load(
            LoadRequest(job.prepared.spec, job.prepared.onnx_path, job.precision, example), job.target
        )
        facts = dict(self.session.facts) | {"python": sys.executable, "python_version": platform.python_version()}
        load_ms = (time.perf_counter() - started) * 1000
        return {"precision": self.session.precision, "load_ms": load_ms, "facts": facts}

    def _measure(self, case: Case, warmup: int, iterations: int, seconds: float) -> Any:
        from harness.run.measure import MeasureConfig, measure

        feeds, _ = self.job.prepared.load_case((case.batch_size, case.seq_len))
        config = MeasureConfig(warmup, iterations, seconds, max_iterations=100_000)
        return measure(self.session, feeds, config, self.rss)

    def warmup(self, case: Case, iterations: int) -> dict[str, Any]:
        measured = self._measure(case, iterations, 1, 0.0)
        return {"first_run_ms": measured.first_run_ms}

    def block(self, case: Case, iterations: int, seconds: float, parity: bool) -> dict[str, Any]:
        measured = self._measure(case, 0, iterations, seconds)
        answer = {
            "samples_ms": measured.samples_ms,
            "load_avg_1m": measured.load_avg_1m,
            "cpu_percent": measured.cpu_percent,
            "memory_peak_mb": measured.memory_peak_mb,
        }
        if parity:  # the block's first run against the reference outputs, once per case
            answer["parity"] = self._parity(case, measured.outputs)
        return answer

    def _parity(self, case: Case, outputs: list) -> dict[str, Any]:
        from harness.core.parity import compare

        prepared = self.job.prepared
        _, reference = prepared.load_case((case.batch_size, case.seq_len))
        if not reference:
            return {"status": "ok", "error": None, "fields": {}, "details": {"parity": "not checked: no reference"}}
        checked = compare(outputs, reference, self.session.precision, prepared.output_names)
        return {"status": checked.status, "error": checked.error, "fields": checked.fields, "details": checked.details}


def serve(job_path: Path) -> None:
    """Answer the parent's commands until stdin closes."""
    from harness.core.failures import classify
    from harness.run.isolation import die_with_parent

    die_with_parent()
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # engines' prints must not corrupt the replies
    server = VariantServer(pickle.loads(job_path.read_bytes()))
    for line in sys.stdin:
        try:
            answer = server.handle(json.loads(line))
        except Exception as exc:  # the command's outcome: the parent records it, the worker stays up
            status, message = classify(exc)
            answer = {"failed": status, "error": message}
        replies.write(json.dumps(answer, default=str) + "\n")


if __name__ == "__main__":
    serve(Path(sys.argv[1]))
