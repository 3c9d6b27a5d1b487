"""Running a suite: one run in the store, executed here (device groups side by side) or on a Ray
cluster, then the reports and the matrix the config asks for.

from harness import load_config, plan_suite, run_suite
summary = run_suite(plan_suite(load_config(Path("suite.toml")), resume=True))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from harness.core.records import Result
from harness.run.outputs import Outputs
from harness.run.recording import RunSummary, record_run
from harness.suite.local import local_body
from harness.suite.plan import SuitePlan


def run_suite(
    plan: SuitePlan, on_result: Callable[[Result, str], None] | None = None, ray_address: str | None = None
) -> RunSummary:
    """Run (or continue) the suite; every result is committed as it completes. Reports follow the config.

    ray_address ("auto" or HOST:PORT) runs each (model, hardware) job as a task on that Ray cluster
    (harness.suite.ray); this process stays the single writer of the store."""
    config = plan.config
    arguments = {"suite": config.name, "config": dataclasses.asdict(config)}
    if ray_address is not None:
        from harness.suite.ray import execute_on_ray  # Ray is an optional extra

        body = execute_on_ray(plan, ray_address)
        arguments["ray_address"] = ray_address
    else:
        body = local_body(plan)
    outputs = Outputs(config.output_dir, html=config.generate_plots, matrix=config.update_compatibility_matrix)
    return record_run(
        config.db,
        "suite",
        arguments,
        [body],
        on_result,
        outputs,
        config.name,
        plan.resume_run_id,
        config.machine_label,
        ceilings=[half.ceilings for half in (plan.native, plan.web) if half is not None],  # reused within a day
    )
