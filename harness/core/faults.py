"""The testing hook that makes a part fail for real: ACCELHARNESS_INJECT_FAULT=KIND[:…][,…].

Workers read it (harness.run.worker: segfault, abort, hang, oom, grandchild); an import reads
`import-hang` (harness.bundle.importer: stop inside the import's transaction, for the kill tests); an export
reads `export-kill` and `export-hang` (harness.prepare.export: die or hang with its staging folder written)."""

from __future__ import annotations

import os

FAULT_ENV = "ACCELHARNESS_INJECT_FAULT"


def injected_faults() -> list[str]:
    """The comma-separated faults the environment asks for (none in normal use)."""
    return [fault for fault in os.environ.get(FAULT_ENV, "").split(",") if fault]
