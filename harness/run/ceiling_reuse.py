"""A target's ceilings measured earlier, taken instead of measured again.

A ceiling moves with the machine and the software that reaches it, not with the run: a run reuses one measured on
the same machine (the run's machine id) for the same target (hardware, engine, EP and its threads, served device)
with the same software (Ceiling.software: the calibrations' version and the engine's, or ORT-web's, the browser's
user agent and the WebGPU adapter, read from the measuring session or page itself) within REUSE_AGE, the fastest,
once a quick check through the target's engine says it still stands (harness.run.ceiling_check). It is copied
into this run's ceilings naming the run that measured it (reused_from), measured_at and samples the original's:
every figure stays one that was measured, and the copy says when. A resumed run takes its own run's ceilings, of
any age, and stores nothing again. `--ceilings fresh` measures every one again; the store's fractions are computed
from the run's ceilings, copies included (harness.store.roofline_sql).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from harness.core.records import Ceiling, Target
from harness.run.ceilings import Prior

# How old a ceiling may be and still stand for the machine: a day of runs (the demo run again, a CI job's suites)
# pays for it once, while a machine's drift over days (another load, a thermal state, a driver update under the
# same versions) is caught by the next day's measurement. `--ceilings fresh` measures now whatever the age.
REUSE_AGE = timedelta(hours=24)
CEILING_MODES = ("reuse", "fresh")  # --ceilings

# Each earlier ceiling a run may take: its own (resumed), and this machine's measured within the age with a value
# and the software it was measured with (a ceiling stored before issue 46 names none: it is never reused).
PRIOR_SQL = """
SELECT c.*, c.run_id = ? AS own FROM ceilings c JOIN runs r USING (run_id)
WHERE c.value > 0 AND c.error IS NULL AND c.software IS NOT NULL
  AND (c.run_id = ? OR (r.machine_id = (SELECT machine_id FROM runs WHERE run_id = ?) AND c.measured_at >= ?))
"""


def _prior(row: dict[str, Any]) -> Prior:
    target = Target(row["hardware"], row["engine"], row["provider"], row["device"])
    ceiling = Ceiling(
        target, row["kind"], row["precision"], row["workload"], row["amount"], list(row["samples_ms"]),
        row["software_adapter"], row["load_avg_1m"], None, row["budget_ms"], row["sizing"], row["software"],
        row["calibration_s"], reused_from=row["reused_from"] or row["run_id"], measured_at=row["measured_at"],
    )  # fmt: skip
    return Prior(ceiling, bool(row["own"]))


@dataclass
class CeilingBook:
    """The earlier ceilings a run may take: loaded by harness.run.recording.record_run once the run's id is known
    (the store is then open for writing), read by each part of the run before it measures a target's."""

    prior: list[Prior] = field(default_factory=list)

    def load(self, store: Any, run_id: str, now: datetime | None = None) -> None:
        since = (now or datetime.now(UTC).replace(tzinfo=None)) - REUSE_AGE  # measured_at is stored in UTC
        self.prior = [_prior(row) for row in store.query(PRIOR_SQL, [run_id, run_id, run_id, since])]

    def for_target(self, target: Target, mode: str) -> tuple[Prior, ...]:
        """The target's earlier ceilings the run may take: none where it measures every one (`--ceilings fresh`)."""
        if mode == "fresh":
            return ()
        return tuple(p for p in self.prior if p.ceiling.target == target)
