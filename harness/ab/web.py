"""The browser half of `accelharness ab` (--web-hardware): both variants in one page, interleaved.

Per EP setting the page loads each variant's ONNX file once (its session stays in the page, keyed by
the file's URL, named per side so identical variants still get a session each), then every round
asks the page for one block of A and one of B in ABBA order, timed in the page with
performance.now() as every web case is. Each block answer is a full page answer; a side's row is
its first block's answer (parity, page facts, adapter) with the samples of all its blocks, tagged
with their rounds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from harness.ab.rounds import CaseFailure, schedule
from harness.browser.run import EpSetting, WebPlan, build_result, page_refusal, platform_seen, precision_model, web_job
from harness.core.records import VARIANTS, Case, Result
from harness.prepare.prepared import PreparedModel
from harness.run.recording import Emit
from harness.web.page_job import StopRule


@dataclass
class WebSide:
    """One variant in the page: its prepared model, its precision and its cases (parallel to the other side's)."""

    side: str
    prepared: PreparedModel
    precision: str
    cases: list[Case]


def _stop(iterations: int, seconds: float, warmup: int) -> StopRule:
    """A block's stop rule: `iterations` samples and `seconds`, no budget, no profile."""
    return StopRule(warmup, iterations, seconds * 1000, max_iterations=100_000, min_iterations=1, max_time_ms=None)


async def _ask(files: Any, session: Any, side: WebSide, setting: EpSetting, case: Case, stop: StopRule,
               timeout_s: float) -> dict[str, Any]:  # fmt: skip
    """One page job of a side; raise CaseFailure with the page's status and reason if it failed."""
    model, _, conversion = precision_model(side.prepared.onnx_path, case.precision)
    if model is None:
        raise CaseFailure(side.side, conversion["status"], conversion["why"])
    feeds, _ = side.prepared.load_case((case.batch_size, case.seq_len))
    name = f"ab-{side.side}-{case.precision}"  # a session per side, even for the same file
    job = web_job(files, name, model, feeds, setting, stop, f"{side.side}|{case.key}")
    answer = await session.run_job(files.page_url, ("ab", setting), job, timeout_s)
    if answer["status"] != "ok":
        raise CaseFailure(side.side, answer["status"], f"variant {side.side.upper()}: {answer['error']}")
    return answer


async def ab_case(files: Any, session: Any, plan: WebPlan, request: Any, sides: dict[str, WebSide],
                  setting: EpSetting, index: int) -> list[Result]:  # fmt: skip
    """Both sides' rows for one case: warmed up, then measured round by round."""
    timeout_s = request.timeout_s
    first_runs, blocks = {}, {side: [] for side in VARIANTS}
    facts = {}
    if (problem := await session.ensure_started()) is not None:  # not started, or not reachable
        raise CaseFailure("a", "error", problem)
    for side in VARIANTS:
        case = sides[side].cases[index]
        refusal, adapter = await page_refusal(session, setting, case, plan.request)
        if refusal is not None:
            raise CaseFailure(side, "unsupported", refusal)
        warm = await _ask(files, session, sides[side], setting, case, _stop(1, 0.0, request.warmup), timeout_s)
        first_runs[side] = warm["first_run_ms"]
        facts[side] = session.facts() | adapter  # the browser, its flags and the adapter this side ran on
    block = _stop(request.block, request.block_time_s, 0)
    for number, order in enumerate(schedule(request.rounds, setting.target, sides["a"].cases[index].key)):
        for side in order:
            answer = await _ask(files, session, sides[side], setting, sides[side].cases[index], block, timeout_s)
            blocks[side].append((number, answer))
    return [
        _row(sides[side], setting, index, blocks[side], first_runs[side], facts[side], request) for side in VARIANTS
    ]


def _row(side: WebSide, setting: EpSetting, index: int, blocks: list[tuple[int, dict]], first_run_ms: float,
         facts: dict[str, Any], request: Any) -> Result:  # fmt: skip
    case = side.cases[index]
    model, precision, conversion = precision_model(side.prepared.onnx_path, case.precision)
    answer = dict(blocks[0][1])  # parity and page facts from the first block
    answer["samples_ms"] = [s for _, block in blocks for s in block["samples_ms"]]
    answer["first_run_ms"] = first_run_ms
    feeds, reference = side.prepared.load_case((case.batch_size, case.seq_len))
    ab = {"side": side.side, "rounds": request.rounds, "block": request.block, "block_time_s": request.block_time_s}
    extra = {
        "load_avg_1m": os.getloadavg()[0],
        "precision": precision,
        "details": facts | conversion | {"input_shapes": {k: list(v.shape) for k, v in feeds.items()}, "ab": ab},
    }
    result = build_result(side.prepared, setting, case, answer, extra, reference, model)
    result.variant = side.side
    result.sample_rounds = [number for number, block in blocks for _ in block["samples_ms"]]
    result.validate()
    return result


async def ab_setting(files: Any, session: Any, plan: WebPlan, request: Any, sides: dict[str, WebSide],
                     setting: EpSetting, emit: Emit) -> None:  # fmt: skip
    """Every case of the pair on one EP setting; a failing case records both sides and the next goes on."""
    for index in range(len(sides["a"].cases)):
        try:
            rows = await ab_case(files, session, plan, request, sides, setting, index)
        except CaseFailure as failure:
            rows = []
            for side in VARIANTS:
                case = sides[side].cases[index]
                if side == failure.side:
                    rows.append(sides[side].prepared.result(setting.target, case, failure.status, failure.message,
                                                            variant=side))  # fmt: skip
                else:
                    why = f"not measured: variant {failure.side.upper()} failed ({failure.message[:300]})"
                    rows.append(sides[side].prepared.result(setting.target, case, "error", why, variant=side))
        for row in rows:
            emit(row)


async def run_web_pairs(plan: WebPlan, request: Any, sides: dict[str, WebSide], emit: Emit) -> None:
    """One browser per EP (as `web` does), both variants' pages jobs alternating in it."""
    from playwright.async_api import async_playwright

    from harness.web.driver import BrowserSession
    from harness.web.server import PageServer

    files = PageServer(isolate=True)
    await files.start()
    try:
        async with async_playwright() as playwright:
            for ep in dict.fromkeys(s.ep for s in plan.settings):
                session = BrowserSession(playwright, plan.browser_source(ep), files)
                seen = False  # the EP's platform as this browser sees it: stored once
                try:
                    for setting in (s for s in plan.settings if s.ep == ep):
                        await ab_setting(files, session, plan, request, sides, setting, emit)
                        if not seen and session.browser is not None:
                            seen = await platform_seen(session, setting, emit)
                finally:
                    await session.close()
    finally:
        await files.stop()
