"""Whether an earlier ceiling still stands: a quick check through the target's own engine before it is reused.

A ceiling is the most the target was seen to sustain (harness.core.roofline): one measured while the machine was
loaded is too low, and every fraction and prediction built on it is wrong by as much (5.6 GB/s reused for runs on a
quiet machine that gave 14.8 GB/s fresh: 2.6x). So before a prior of another run is reused (harness.run.ceiling_reuse
finds them, the fastest chosen), its own size is run once more as a probe is (two warm runs after two untimed, the
faster kept: natively harness.run.ceilings._probe, in the page its probe job), and the prior stands only when that
rate does not exceed the prior's fastest by more than TOLERANCE. A rate below it says the machine is busier now, not
that the target got slower: the prior stands. Past it, the ceiling is measured afresh and says why. Either way the
check's rate, how long it took and when are written on the stored ceiling (its sizing). A resumed run's own ceiling is
this run's measurement and is taken as it is; `--ceilings fresh` measures every one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime

from harness.core.records import Ceiling
from harness.core.roofline import UNITS, ceiling_figures

# How far a quick check may come above the prior's fastest sample and the prior still stand. Measured here
# (docs/measurement.md): on this 2-core machine, quiet (load 0.6), ORT CPU at 1 and 2 threads, 8 full measurements
# and 8 checks each of the bandwidth (64 MiB) and fp32 MatMul (1.07 GFLOP) graphs: no check came more than 1.7% above
# any of the measurements (the check, 2 runs against up to 50, mostly lands 1-9% below). 10% leaves a noisy check room
# without throwing away a fair prior, and catches a prior measured on a loaded machine (2.6x low in the fault seen).
TOLERANCE = 0.10
CHECKED = "quick check "  # how a check's words begin on a ceiling's sizing (a copy's earlier check is dropped)


@dataclass(frozen=True)
class Check:
    """A quick check of a prior ceiling (its own size, a probe's runs) and its result."""

    prior: Ceiling
    fastest_ms: float  # the check's faster warm run
    seconds: float  # the check's own wall time, its graph's load included
    at: datetime  # when it ran (UTC)

    @property
    def rate(self) -> float:
        return self.prior.amount / (self.fastest_ms / 1000.0) / 1e9

    @property
    def prior_rate(self) -> float:
        return ceiling_figures(self.prior.amount, self.prior.samples_ms)[0] or 0.0

    @property
    def stands(self) -> bool:
        return self.rate <= self.prior_rate * (1.0 + TOLERANCE)

    def words(self) -> str:
        unit, run = UNITS[self.prior.kind], self.prior.reused_from
        when = f"in {self.seconds:.2g} s at {self.at:%Y-%m-%d %H:%M:%S} UTC"
        sign, verdict = ("<=", "reused") if self.stands else (">", f"prior of run {run} re-measured")
        return (f"{CHECKED}{self.rate:.3g} {unit} {sign} run {run}'s {self.prior_rate:.3g} {unit} x "
                f"{1.0 + TOLERANCE:g} ({when}): {verdict}")  # fmt: skip


def now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def checked(check: Check, measured: Ceiling | None = None) -> Ceiling:
    """The ceiling a check leaves: the prior's copy when it stands, else `measured` (the fresh one); either states the
    check before how its size was chosen."""
    ceiling = check.prior if check.stands or measured is None else measured
    return replace(ceiling, sizing=f"{check.words()}; {_unchecked(ceiling.sizing)}")


def _unchecked(sizing: str | None) -> str:
    """A sizing without an earlier check's words (a copy of a copy states only its own run's check)."""
    text = sizing or "no sizing stated"
    return text.split("; ", 1)[1] if text.startswith(CHECKED) and "; " in text else text
