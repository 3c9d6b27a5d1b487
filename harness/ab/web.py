"""The browser half of `accelharness ab` (--web-hardware): both variants interleaved, each in its browser's page.

Per pair of EP settings (harness.ab.web_plan: both sides in one browser, or A in one and B in another) each
side's page loads its variant's ONNX file once (its session stays in the page, keyed by the file's URL, named per
side so identical variants still get a session each), then every round asks for one block of A and one of B in
ABBA order, timed in the page with performance.now() as every web case is. A Chromium's page is driven through
Playwright; a Firefox's or Safari's is the served page, handed each block as a job (harness.browser.
launched_session). Each block answer is a full page answer; a side's row is its first block's answer (parity, page
facts, adapter) with the samples of all its blocks, tagged with their rounds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from harness.ab.rounds import CaseFailure, schedule
from harness.ab.sessions import Browsers, Place
from harness.browser.run import EpSetting, WebPlan, build_result, page_refusal, precision_model, web_job
from harness.core.faults import injected_faults
from harness.core.records import VARIANTS, Case, Result
from harness.prepare.prepared import PreparedModel
from harness.run.recording import Emit
from harness.web.page_job import StopRule

# The faults hook (tests; harness.core.faults): `ab-page:KIND:SIDE:CASE` hands variant SIDE's first block of the
# case whose key is CASE (b1_s16_fp32) the page fault KIND (runner.mjs: throw, hang; kill: the browser is killed
# mid-job), in every browser.
AB_PAGE_FAULT = "ab-page"


def planted_fault(side: str, case: Case) -> str | None:
    for fault in injected_faults():
        parts = fault.split(":")
        if len(parts) == 4 and parts[0] == AB_PAGE_FAULT and parts[2:] == [side, case.key]:
            return parts[1]
    return None


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


async def _ask(place: Place, side: WebSide, case: Case, stop: StopRule, timeout_s: float,
               fault: str | None = None) -> dict[str, Any]:  # fmt: skip
    """One page job of a side; raise CaseFailure with the page's status and reason if it failed."""
    model, _, conversion = precision_model(side.prepared.onnx_path, case.precision)
    if model is None:
        raise CaseFailure(side.side, conversion["status"], conversion["why"])
    feeds, _ = side.prepared.load_case((case.batch_size, case.seq_len))
    name = f"ab-{side.side}-{case.precision}"  # a session per side, even for the same file
    job = web_job(place.files, name, model, feeds, place.setting, stop, f"{side.side}|{case.key}", fault)
    answer = await place.session.run_job(place.files.page_url, ("ab", place.setting), job, timeout_s)
    if answer["status"] != "ok":
        raise CaseFailure(side.side, answer["status"], f"variant {side.side.upper()}: {answer['error']}")
    return answer


async def ab_case(plan: WebPlan, request: Any, sides: dict[str, WebSide], places: dict[str, Place],
                  index: int) -> list[Result]:  # fmt: skip
    """Both sides' rows for one case: warmed up, then measured round by round."""
    timeout_s = request.timeout_s
    first_runs, blocks = {}, {side: [] for side in VARIANTS}
    facts = {}
    for side in VARIANTS:
        case, place = sides[side].cases[index], places[side]
        if (problem := await place.session.ensure_started()) is not None:  # not started, or not reachable
            raise CaseFailure(side, "error", problem)
        refusal, adapter = await page_refusal(place.session, place.setting, case, plan.request)
        if refusal is not None:
            raise CaseFailure(side, "unsupported", refusal)
        warm = await _ask(place, sides[side], case, _stop(1, 0.0, request.warmup), timeout_s)
        first_runs[side] = warm["first_run_ms"]
        facts[side] = place.session.facts() | adapter  # the browser, its flags and the adapter this side ran on
    block = _stop(request.block, request.block_time_s, 0)
    for number, order in enumerate(schedule(request.rounds, places["a"].setting.target, sides["a"].cases[index].key)):
        for side in order:
            case = sides[side].cases[index]
            fault = planted_fault(side, case) if number == 0 else None
            answer = await _ask(places[side], sides[side], case, block, timeout_s, fault)
            blocks[side].append((number, answer))
    return [
        _row(sides[side], places[side].setting, index, blocks[side], first_runs[side], facts[side], request)
        for side in VARIANTS
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


async def ab_setting(plan: WebPlan, request: Any, sides: dict[str, WebSide], places: dict[str, Place],
                     emit: Emit) -> None:  # fmt: skip
    """Every case of the pair on its EP settings; a failing case records both sides and the next goes on."""
    for index in range(len(sides["a"].cases)):
        try:
            rows = await ab_case(plan, request, sides, places, index)
        except CaseFailure as failure:
            rows = []
            for side in VARIANTS:
                case, status, why = sides[side].cases[index], failure.status, failure.message
                if side != failure.side:
                    status, why = "error", f"not measured: variant {failure.side.upper()} failed ({why[:300]})"
                facts = places[side].session.facts()  # the browser the case failed in
                target = places[side].setting.target
                rows.append(sides[side].prepared.result(target, case, status, why, variant=side, details=facts))
        for row in rows:
            emit(row)


async def run_web_pairs(plan: WebPlan, request: Any, sides: dict[str, WebSide], pairs: list[dict[str, EpSetting]],
                        emit: Emit) -> None:  # fmt: skip
    """Every pair of EP settings in its order, each side's browser opened on first use and closed after the last
    pair that needs it (harness.ab.sessions): per browser, one browser after the other, as `web` runs them."""
    browsers = Browsers(plan, request, _output_bytes(sides), _describe(request, sides, pairs))
    try:
        for number, pair in enumerate(pairs):
            places = {side: await browsers.place(pair[side]) for side in VARIANTS}
            await ab_setting(plan, request, sides, places, emit)
            for place in places.values():
                await browsers.platform_seen(place, emit)
            await browsers.close_after(number, pairs)
    finally:
        await browsers.close()


def _output_bytes(sides: dict[str, WebSide]) -> int:
    """The most output bytes any case of either side answers with (its reference's): what bounds an answer."""
    return max(
        sum(r.nbytes for r in side.prepared.load_case((c.batch_size, c.seq_len))[1])
        for side in sides.values()
        for c in side.cases
    )


def _describe(request: Any, sides: dict[str, WebSide], pairs: list[dict[str, EpSetting]]) -> dict[str, Any]:
    """What the served page shows of the run."""
    measuring = (
        f"ab: {request.rounds} rounds of a block of A and one of B (ABBA), each block at least {request.block} "
        f"iterations and {request.block_time_s:g} s; --timeout {request.timeout_s:g} s per block"
    )
    cases = [f"{c.key} {c.precision}" for c in sides["a"].cases]
    models = [f"{side.side.upper()}: {side.prepared.spec.name}" for side in sides.values()]
    hardware = list(dict.fromkeys(s.target.label for pair in pairs for s in pair.values()))
    return {"models": models, "cases": cases, "hardware": hardware, "measuring": measuring}
