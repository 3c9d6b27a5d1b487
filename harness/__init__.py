"""accelharness: measured ML inference benchmarks across native backends and the browser.

The CLI (`accelharness`) is a thin layer over this API:

    from harness import BenchmarkRequest, run_native, open_store, write_reports
    summary = run_native(BenchmarkRequest(models=["bert-tiny"], hardware=["cpu"]))
"""

from harness.api import BenchmarkRequest, RequestError, RunSummary, run_native, validate
from harness.hardware import detect_platforms
from harness.report import write_reports
from harness.specs import load_specs
from harness.stats import summarize
from harness.store import open_store

__version__ = "0.1.0"

__all__ = [
    "BenchmarkRequest",
    "RequestError",
    "RunSummary",
    "detect_platforms",
    "load_specs",
    "open_store",
    "run_native",
    "summarize",
    "validate",
    "write_reports",
]
