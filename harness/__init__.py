"""accelharness: measured ML inference benchmarks across native backends and the browser.

The CLI (`accelharness`) is a thin layer over this API:

    from harness import BenchmarkRequest, run_native, open_store, write_reports
    summary = run_native(BenchmarkRequest(models=["bert-tiny"], hardware=["cpu"]))
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Imported on first use (PEP 562): every worker process imports harness.run.worker, and importing the
# whole API there would cost each worker seconds of torch/transformers imports it may not need.
_EXPORTS = {
    "BenchmarkRequest": "harness.run.plan",
    "RequestError": "harness.run.plan",
    "validate": "harness.run.plan",
    "run_native": "harness.run.native",
    "WebRequest": "harness.browser.run",
    "validate_web": "harness.browser.run",
    "run_web": "harness.browser.execute",
    "ServeRequest": "harness.browser.serve",
    "validate_serve": "harness.browser.serve",
    "run_serve": "harness.browser.serve",
    "run_both": "harness.browser.both",
    "AbRequest": "harness.ab.run",
    "validate_ab": "harness.ab.run",
    "run_ab": "harness.ab.run",
    "compare_pair": "harness.analysis.paired",
    "compare_runs": "harness.analysis.compare",
    "RunSummary": "harness.run.recording",
    "detect_platforms": "harness.run.hardware",
    "write_reports": "harness.report",
    "load_specs": "harness.prepare.specs",
    "summarize": "harness.core.stats",
    "open_store": "harness.store",
    "load_config": "harness.suite.config",
    "plan_suite": "harness.suite.plan",
    "run_suite": "harness.suite.run",
    "export_bundle": "harness.bundle.export",
    "import_bundles": "harness.bundle.importer",
    "merge_stores": "harness.bundle.importer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'harness' has no attribute '{name}'")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
