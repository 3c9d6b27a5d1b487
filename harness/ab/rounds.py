"""What the native and the browser halves of `accelharness ab` share: the round schedule, and how a
side's failure is told."""

from __future__ import annotations

import random

from harness.core.records import Target

SCHEDULE_SEED = 20261125


class CaseFailure(RuntimeError):
    """A command failed inside a variant's worker (e.g. the engine cannot run this case); the worker
    lives on, and the case is recorded with the side's status and reason."""

    def __init__(self, side: str, status: str, message: str) -> None:
        super().__init__(message)
        self.side, self.status, self.message = side, status, message


class WorkerFailure(CaseFailure):
    """A variant's worker died or stopped answering: every case it has left gets this outcome."""


def schedule(rounds: int, target: Target, case_key: str) -> list[tuple[str, str]]:
    """ABBA…: the order alternates every round; whether A or B starts is drawn per case (seeded)."""
    a_first = random.Random(f"{SCHEDULE_SEED}|{target.label}|{case_key}").random() < 0.5
    return [("a", "b") if (r % 2 == 0) == a_first else ("b", "a") for r in range(rounds)]
