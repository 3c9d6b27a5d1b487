"""A WebGPU device proved before a page loads a model: a trivial dispatch under a short deadline.

A device that makes no progress (Mesa's lavapipe behind Chromium's `--gpu on` on a machine with no
GPU) does not fail: every ORT call on it waits, so every page job, the drift control's included,
ends only at --timeout (300 s by default). The page (runner.mjs: probeAdapter, then proveDevice)
finds an adapter, then runs a one-workgroup compute shader whose buffer it maps back, each step
under the EP's deadline (eps.json's device_probe_s), and says which step made no progress. This
side asks for each step apart and waits for it with a limit of its own: a page whose main thread is
stuck cannot report its own deadline, but the adapter it found in the first step is known by then.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from harness.web.adapter import adapter_name
from harness.web.eps import EPS

# Beyond the page's own deadline: the evaluate round trip on a loaded machine or a remote connection.
PROBE_GRACE_S = 5.0
STEPS = ("probeAdapter", "proveDevice")  # window.accelharness functions; neither ever rejects


@dataclass(frozen=True)
class Stall:
    """A device that made no progress: the `unsupported` answer every later job of its setting gets at
    once, and whether the page itself stopped answering (then its browser is restarted)."""

    answer: dict[str, Any]
    page_stuck: bool


def probes_device(ep: str) -> bool:
    return EPS[ep].device_probe_s is not None


async def prove_device(page: Any, ep: str, fault: str | None) -> Stall | None:
    """None when the page's device answered, or failed in a way its job reports in the page's words
    (no adapter, a device that cannot be made); a Stall when it made no progress."""
    deadline_s = EPS[ep].device_probe_s
    assert deadline_s is not None
    found: dict[str, Any] = {"deadline_s": deadline_s}
    for step in STEPS:
        call = page.evaluate(f"([ep, fault]) => window.accelharness.{step}(ep, fault)", [ep, fault])
        try:
            answer = await asyncio.wait_for(call, deadline_s + PROBE_GRACE_S)
        except TimeoutError:
            why = f"{no_progress(step, found, deadline_s)}: the page gave no answer within "
            why += f"{deadline_s + PROBE_GRACE_S:g} s (its main thread is stuck)"
            return Stall(_unsupported(why, found), page_stuck=True)
        if not isinstance(answer, dict) or not isinstance(answer.get("device_probe"), dict):
            return None  # not the page's probe: its job will fail and say how
        found = answer["device_probe"]
        if answer.get("ok") is not True:
            stalled = answer.get("no_progress") is True and isinstance(answer.get("error"), str)
            return Stall(_unsupported(answer["error"], found), page_stuck=False) if stalled else None
    return None


def no_progress(step: str, found: dict[str, Any], deadline_s: float) -> str:
    """The page's own sentence for a step past its deadline (runner.mjs), for a page that cannot say it."""
    if step == "probeAdapter" or not isinstance(found.get("adapter"), dict):
        return f"navigator.gpu.requestAdapter() made no progress in {deadline_s:g} s"
    name = adapter_name(found["adapter"])
    return f"WebGPU adapter '{name}' made no progress on a trivial dispatch in {deadline_s:g} s"


def _unsupported(why: str, found: dict[str, Any]) -> dict[str, Any]:
    return {"status": "unsupported", "error": why, "facts": {"device_probe": found}}
