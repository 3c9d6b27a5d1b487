"""The HTML report's generation section: per model, every target's TTFT and its prefill (pp) and decode (tg)
rates side by side, native and browser, quality beside the fp32 graph (top-1 agreement, mean KL, where the tokens
first leave fp32's; perplexity on the harness's passage, its ratio to fp32's and the KL over it), token parity
with native ONNX Runtime and the graph it was checked on, the EOS policy, prompt and output text (model output:
escaped), and the step-time curve
(the median time of each decode step over the generated positions) as inline SVG."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from html import escape
from typing import Any

from harness.analysis.speech import details_of
from harness.core.generation import DECODE_RATE, PREFILL_RATE, step_curve
from harness.core.labels import case_label, target_label
from harness.core.terminal import terminal_text
from harness.report.data import RunReport

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
WIDTH, PLOT_WIDTH, HEIGHT, PAD = 900, 520, 220, 56
LOG_RATIO = 30.0  # a log scale once the slowest step is this many times the fastest
NO_CURVE = "No decode steps to draw (one token, or no measured row)."
COLUMNS = (("TTFT p50 ms", "ttft_ms", 3), (PREFILL_RATE, "prefill_tokens_per_s", 1),
           (DECODE_RATE, "decode_tokens_per_s", 1), ("TPOT p50 ms", "tpot_ms", 3), ("TPOT p90 ms", "tpot_p90_ms", 3),
           ("e2e p50 ms", "latency_p50_ms", 3), ("top-1 agreement vs fp32", "agreement_top1", 3),
           ("KL vs fp32", "kl_mean", 4), ("first divergence vs fp32", "first_divergence", None),
           ("PPL (passage)", "perplexity", 2), ("PPL ÷ fp32", "perplexity_ratio", 4), ("KL passage", "kl_passage", 5),
           ("encoder p50 ms", "encoder_ms", 3), ("real-time factor", "real_time_factor", 1))  # fmt: skip


def _fmt(value: float | str | None, digits: int | None) -> str:
    return "—" if value is None else str(value) if digits is None else f"{value:.{digits}f}"


def _parity(row: dict[str, Any]) -> str:
    if row.get("tokens_matched") is None:
        return "—"
    return f"{row['tokens_matched']}/{row['new_tokens']}"


SHOWN_IDS = 8  # prompt ids a table shows (then the count)
SHOWN_CHARS = 200  # characters of output text a table shows (then …); the store keeps all of it
SHOWN_TEXTS = 8  # batch rows' output texts a table shows (then the count); the store keeps every one


def eos_text(row: dict[str, Any]) -> str:
    """The EOS policy that ran, as the tables state it."""
    return {True: "stopped at EOS", False: "EOS ignored"}.get(row.get("stop_at_eos"), "—")


def prompt_text(row: dict[str, Any]) -> str:
    """The first batch row's prompt ids, the first SHOWN_IDS of them and the count."""
    try:
        ids = json.loads(row.get("prompt_ids") or "null")
        first = ids[0] if isinstance(ids, list) and ids and isinstance(ids[0], list) else None
    except (TypeError, ValueError, RecursionError):  # a stored value from elsewhere that is not the JSON expected
        first = None
    if first is None:
        return "—"
    shown = ", ".join(str(i) for i in first[:SHOWN_IDS]) + (", …" if len(first) > SHOWN_IDS else "")
    return f"{len(first)} ids: {shown}"


def output_text(row: dict[str, Any]) -> str:
    """Every batch row's decoded output, each cut at SHOWN_CHARS and numbered where there are several; plain
    text for the caller to escape (it is model output). A store before v12 (or a batch-1 row) has one text."""
    texts = _texts(row)
    if not texts:
        return "—"
    cut = [t if len(t) <= SHOWN_CHARS else t[:SHOWN_CHARS] + "…" for t in texts[:SHOWN_TEXTS]]
    more = f" (+{len(texts) - SHOWN_TEXTS} rows)" if len(texts) > SHOWN_TEXTS else ""
    return cut[0] if len(cut) == 1 else " ".join(f"[{i}] {t}" for i, t in enumerate(cut, 1)) + more


def _texts(row: dict[str, Any]) -> list[str]:
    """output_texts as the JSON list of strings it should be (a value from elsewhere that is not: output_text)."""
    try:
        texts = json.loads(row.get("output_texts") or "null")
    except (TypeError, ValueError, RecursionError):
        texts = None
    if isinstance(texts, list) and texts and all(isinstance(t, str) for t in texts):
        return texts
    return [row["output_text"]] if isinstance(row.get("output_text"), str) else []


TEXT_COLUMNS = (("EOS", eos_text), ("prompt", prompt_text), ("output text", output_text))
WER_HEADER = "WER"  # a speech row's word error rate (details.wer, harness.prepare.wer), beside its real-time factor
NATIVE_ORT = ("onnxruntime", "CPUExecutionProvider")  # the rows every other row's tokens are checked against
SAME_CASE = ("model", "batch_size", "seq_len", "new_tokens", "depth", "audio_seconds", "requested_precision")


def _number(value: Any) -> float | None:
    """A stored number (from elsewhere: a bundle's details) as a float, or None where it is not a finite one."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def divergence_text(details: dict[str, Any]) -> str | None:
    """Where a row's greedy tokens leave the fp32 reference's, as a table shows it: the position, "none" where they
    never do (the stored null beside a measured agreement), None where it was not measured."""
    if "first_divergence" not in details:
        return None
    value = details["first_divergence"]
    if value is None:
        return "none"
    return str(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def quality_cells(row: dict[str, Any]) -> dict[str, Any]:
    """A generate row's quality figures kept in its details, as cells beside its speed (harness.prepare.perplexity,
    harness.prepare.quality): perplexity on the passage, its ratio to fp32's, the KL over the passage and the first
    divergence of its tokens from the fp32 reference's."""
    details = details_of(row)
    figures = {key: _number(details.get(key)) for key in ("perplexity", "perplexity_ratio", "kl_passage")}
    return figures | {"first_divergence": divergence_text(details)}


def wer_value(row: dict[str, Any]) -> float | None:
    """A speech row's stored word error rate (a number from elsewhere that is not one: None)."""
    value = details_of(row).get("wer")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def wer_text(row: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """A speech row's WER as a table shows it, and whether it is native ORT's on the same case (the rows' WER is a
    function of their tokens: equal tokens, equal WER; a difference is said, with whether the tokens differ)."""
    wer = wer_value(row)
    if wer is None:
        return "—"
    if (row.get("engine"), row.get("provider")) == NATIVE_ORT:
        return f"{wer:.3f}"
    native = next((r for r in rows if (r.get("engine"), r.get("provider")) == NATIVE_ORT
                   and all(r.get(k) == row.get(k) for k in SAME_CASE) and wer_value(r) is not None), None)  # fmt: skip
    if native is None:
        return f"{wer:.3f}"
    theirs = wer_value(native)
    assert theirs is not None
    if abs(wer - theirs) < 1e-12:
        return f"{wer:.3f} (= native ORT)"
    tokens = "tokens differ" if row.get("generated_tokens") != native.get("generated_tokens") else "same tokens"
    return f"{wer:.3f} (native ORT {theirs:.3f}: {tokens})"


def _table(rows: list[dict[str, Any]]) -> str:
    speech = any(wer_value(r) is not None for r in rows)  # the WER column where a row of the model has one
    headers = ("target", "case", "status", *(c[0] for c in COLUMNS), *((WER_HEADER,) if speech else ()),
               "tokens = native ORT", "tokens checked on", *(c[0] for c in TEXT_COLUMNS))  # fmt: skip
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    rows = [r | quality_cells(r) for r in rows]  # the figures a row keeps in its details, beside its speed
    body = "".join(
        f"<tr><td>{escape(target_label(r))}</td><td>{escape(case_label(r))}</td><td>{escape(r['status'])}</td>"
        + "".join(f'<td class="num">{escape(_fmt(r.get(field), digits))}</td>' for _, field, digits in COLUMNS)
        + (f'<td class="num">{escape(wer_text(r, rows))}</td>' if speech else "")
        + f'<td class="num">{_parity(r)}</td><td>{escape(r.get("token_reference") or "—")}</td>'
        + "".join(f'<td class="gen-text">{escape(terminal_text(shown(r)))}</td>' for _, shown in TEXT_COLUMNS)
        + "</tr>"
        for r in rows
    )
    # scrolls inside its own box when wider than the page (harness.report.html's .table-scroll)
    return f'<div class="table-scroll"><table class="results"><tr>{head}</tr>{body}</table></div>'


def _curve_svg(curves: list[tuple[str, list[float]]]) -> str:
    """Polylines of step time (ms) against the decode position, one per target, on a shared scale (log when
    the targets are more than LOG_RATIO apart), the legend to the right of the plot."""
    every = [v for _, values in curves for v in values]
    low, top = min(every), max(every)
    log = low > 0 and top / low > LOG_RATIO
    scale = (lambda v: math.log10(v)) if log else (lambda v: v)
    bottom_value = scale(low) if log else 0.0
    span = (scale(top) - bottom_value) or 1.0
    longest = max(len(values) for _, values in curves)
    x_step = (PLOT_WIDTH - PAD) / max(longest - 1, 1)
    lines, legend = [], []
    for i, (label, values) in enumerate(curves):
        color = COLORS[i % len(COLORS)]
        points = " ".join(
            f"{PAD + j * x_step:.1f},{HEIGHT - PAD - (scale(v) - bottom_value) / span * (HEIGHT - 2 * PAD):.1f}"
            for j, v in enumerate(values)
        )
        lines.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{points}"/>')
        legend.append(
            f'<text x="{PLOT_WIDTH + 12}" y="{PAD + 14 * i}" font-size="11" fill="{color}">{escape(label)}</text>'
        )
    axes = (
        f'<line x1="{PAD}" y1="{HEIGHT - PAD}" x2="{PLOT_WIDTH}" y2="{HEIGHT - PAD}" stroke="#888"/>'
        f'<line x1="{PAD}" y1="{PAD}" x2="{PAD}" y2="{HEIGHT - PAD}" stroke="#888"/>'
        f'<text x="{(PAD + PLOT_WIDTH) / 2}" y="{HEIGHT - 8}" font-size="11" text-anchor="middle">decode step '
        f"(generated position 2…{longest + 1}){', log scale' if log else ''}</text>"
        f'<text x="{PAD - 4}" y="{PAD + 4}" font-size="11" text-anchor="end">{top:.3g} ms</text>'
        f'<text x="{PAD - 4}" y="{HEIGHT - PAD}" font-size="11" text-anchor="end">{low if log else 0:.3g}</text>'
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="decode step time per generated position">{axes}{"".join(lines)}{"".join(legend)}</svg>'
    )


def generation_html(report: RunReport) -> str:
    """One section per model that has generate rows; empty when the run generated nothing."""
    by_model: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in report.results:
        if row.get("mode") == "generate":
            by_model[row["model"]].append(row)
    parts = []
    for model, rows in sorted(by_model.items()):
        curves = [
            (f"{target_label(r)} {case_label(r)}", curve)
            for r in rows
            if (curve := step_curve(report.steps.get(r["result_id"], [])))
        ]
        figure = (
            _curve_svg(curves)
            if curves
            else '<p class="omitted">No decode steps to draw (one token, or no measured row).</p>'
        )
        parts.append(
            f"<h4>Generation: {escape(model)}</h4>"
            '<p class="sub">TTFT: prefill until the first logits are on the CPU. pp: prompt tokens ÷ TTFT; '
            "tg: decode tokens ÷ the sum of the decode steps; never a rate over both phases. Tokens: the common "
            "prefix with native ONNX Runtime's greedy tokens on the same graph. EOS: the policy that ran (EOS ignored: "
            "exactly the new tokens asked, for fixed-length timing; --stop-at-eos stops at the model's EOS id). "
            "Prompt: the first batch row's ids; output text: each batch row's tokens through the model's tokenizer, "
            "numbered where the batch has several. WER (speech): the word error rate of the output text against the "
            "words the audio speaks (details.wer_reference), both normalized as Whisper's English normalizer does, "
            "over the reference's first words that the row's text covers (details.wer_words).</p>"
            f"{_table(rows)}<figure>{figure}<figcaption>Median decode-step time per generated position, per "
            "target.</figcaption></figure>"
        )
    return "".join(parts)
