"""Where the browser half of `accelharness ab` (--web-hardware) runs each side.

With --browser (a list, as `web --browser`), both variants run in each browser: a pair of rows per browser, EP
setting and case, A and B interleaved in the same browser, so the verdict is the variants' in that browser (B's
change may cost more in one engine than in another). With --a-browser and --b-browser, A runs in one browser and
B in the other, both open for the whole run and their blocks interleaved: the verdict is then the browsers' (on
the same file, or on two), with the machine's drift shared as it is between two variants.
"""

from __future__ import annotations

from typing import Any

from harness.browser.run import EpSetting, WebPlan, WebRequest, browser_device, validate_web
from harness.core.options import declared
from harness.core.records import VARIANTS
from harness.run.plan import RequestError

LAUNCH = ("browsers", "browser_path", "driver", "webdriver_url")  # as `web` takes them
BROWSER_HALF = (*LAUNCH, "a_browser", "b_browser")  # what has no meaning without --web-hardware


def check_browser_half(request: Any) -> None:
    """The browser options: only with --web-hardware; --a-browser and --b-browser together, two browsers, and not
    with a --browser list (which runs both variants in each)."""
    options, defaults = declared(type(request)), type(request)()
    given = [options[name].flag for name in BROWSER_HALF if getattr(request, name) != getattr(defaults, name)]
    if given and not request.web_hardware:
        raise RequestError(
            f"{', '.join(given)}: the browser half's, which runs only with --web-hardware (add --web-hardware wasm, "
            "or drop them)"
        )
    if (request.a_browser is None) != (request.b_browser is None):
        raise RequestError("--a-browser and --b-browser go together: A runs in one browser, B in the other")
    if request.a_browser is None:
        return
    if request.browsers != defaults.browsers:
        raise RequestError(
            "--browser runs both variants in each browser; --a-browser/--b-browser run A in one and B in the other: "
            "give one or the other"
        )
    if request.a_browser == request.b_browser:
        raise RequestError(
            f"--a-browser and --b-browser are both {request.a_browser}: for both variants in one browser, give "
            f"--browser {request.a_browser}"
        )


def web_plan(request: Any) -> WebPlan:
    """The browser half's EP settings and browsers, checked (each browser found) as `web` checks them."""
    browsers = [request.a_browser, request.b_browser] if request.a_browser else request.browsers
    web = WebRequest(
        hardware=list(request.web_hardware or []), threads=request.threads, batch_sizes=request.batch_sizes,
        sequence_lengths=request.sequence_lengths, warmup=request.warmup, timeout_s=request.timeout_s,
        db_path=request.db_path, output_dir=None, browsers=browsers,
        **{name: getattr(request, name) for name in LAUNCH if name != "browsers"},
    )  # fmt: skip
    return validate_web(web)


def web_pairs(request: Any, web: WebPlan) -> list[dict[str, EpSetting]]:
    """Each pair's EP setting per side, in the order they run: per browser, both sides on one setting; across
    browsers, A's setting in its browser beside B's same EP and threads in the other."""
    if request.a_browser is None:
        return [dict.fromkeys(VARIANTS, setting) for setting in web.settings]
    mine = {side: [s for s in web.settings if s.device == browser_device(getattr(request, f"{side}_browser"))]
            for side in VARIANTS}  # fmt: skip
    return [{"a": a, "b": b} for a, b in zip(mine["a"], mine["b"], strict=True)]
