"""The time budget (--max-time) of harness/run/measure.py's loop, on real clocks: each step sleeps. Only
counts are asserted, on the side that load cannot flip (a slower machine stops sooner, never later)."""

from __future__ import annotations

import time

from harness.run.measure import Budget, MeasureConfig


def sleeping(seconds: float) -> float:
    started = time.perf_counter()
    time.sleep(seconds)
    return (time.perf_counter() - started) * 1000


def test_a_spent_budget_stops_warmup_and_loop_but_never_below_min_iterations() -> None:
    config = MeasureConfig(warmup=50, iterations=50, min_duration_s=0, max_iterations=50, max_time_s=0.01)
    budget = Budget(config)
    sleeping(0.05)  # the first run alone spends the budget
    budget.warm_up(lambda: sleeping(0.05))
    samples = budget.timed_iterations(lambda: sleeping(0.02))
    assert budget.warmup_run == 0 and len(samples) == config.min_iterations == 3
    assert budget.facts == {"max_time_s": 0.01, "warmup_run": 0, "budget_stopped": True}


def test_the_budget_ends_a_long_loop_early() -> None:
    config = MeasureConfig(warmup=2, iterations=1000, min_duration_s=0, max_iterations=1000, max_time_s=0.3)
    budget = Budget(config)
    budget.warm_up(lambda: sleeping(0.01))
    samples = budget.timed_iterations(lambda: sleeping(0.01))
    assert budget.warmup_run == 2 and 3 <= len(samples) < 1000
    assert budget.stopped


def test_a_loop_that_fits_the_budget_keeps_its_count_and_is_not_marked() -> None:
    config = MeasureConfig(warmup=1, iterations=4, min_duration_s=0, max_iterations=10, max_time_s=600)
    budget = Budget(config)
    budget.warm_up(lambda: sleeping(0.001))
    assert len(budget.timed_iterations(lambda: sleeping(0.001))) == 4
    assert budget.facts == {"max_time_s": 600, "warmup_run": 1, "budget_stopped": False}
    unbudgeted = Budget(MeasureConfig(warmup=0, iterations=2, min_duration_s=0, max_time_s=None))
    assert len(unbudgeted.timed_iterations(lambda: sleeping(0.001))) == 2 and not unbudgeted.stopped
