"""The one table of page runtimes: web/page/runtimes.json, read here and fetched by the page.

A page runtime is what a browser app ships to run a model: our own greedy loop over onnxruntime-web
(runner.mjs, generate.mjs), transformers.js (its model classes and generate loop, over its own bundled
onnxruntime-web), llama.cpp compiled to wasm (wllama), WebLLM (MLC/TVM). Each row says which npm package
carries it, which page module runs it (web/page/runtimes/), the model format it loads, the browser EPs
(backends) and modes it runs, whether the page sets its thread count, and the sentence recorded on every
row saying how the page checks what ran. A row's engine is its runtime's name; what a runtime cannot run
is planned as an `unsupported` row with its own reason (harness.browser.runtimes), never sent to the page.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TABLE = Path(__file__).parent / "page" / "runtimes.json"
OWN_RUNTIME = "onnxruntime-web"  # the page's own loop: every EP, inference and generation


@dataclass(frozen=True)
class PageRuntime:
    name: str
    package: str  # the npm package served to the page (web/package-lock.json pins it)
    module: str | None  # web/page/runtimes/<module>; None: runner.mjs's own loop
    format: str  # onnx, gguf, mlc
    backends: tuple[str, ...]  # the browser EPs (web/page/eps.json's names) it runs on
    modes: tuple[str, ...]
    threads: bool  # the page sets its wasm thread count and reads it back
    check: str

    def refusal(self, ep: str, mode: str) -> str | None:
        """Why this runtime cannot run a case of `mode` on `ep`, or None."""
        if mode not in self.modes:
            return f"{self.name} runs {', '.join(self.modes)} here, not {mode}"
        if ep not in self.backends:
            return f"{self.name} runs on {', '.join(self.backends)} here, not {ep}"
        return None


def _load() -> dict[str, PageRuntime]:
    rows = json.loads(TABLE.read_text())
    return {
        name: PageRuntime(
            name,
            row["package"],
            row.get("module"),
            row["format"],
            tuple(row["backends"]),
            tuple(row["modes"]),
            bool(row["threads"]),
            row["check"],
        )
        for name, row in rows.items()
    }


RUNTIMES = _load()
PAGE_RUNTIMES = tuple(RUNTIMES)  # the table's order is the run's order
