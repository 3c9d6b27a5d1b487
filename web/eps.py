"""The one table of browser execution providers: web/page/eps.json, read here and fetched by the page.

Each EP has: the ORT-web bundle the page imports (the import ORT's docs give for it; the wasm EP
gets the plain, non-asyncify build: on bert-tiny the JSEP/asyncify builds ran the same wasm EP
2-6x slower); the wasm binary that bundle runs (the page fetches it, hands it to ORT as
env.wasm.wasmBinary and checks it against the glue code ORT loaded); the provider name ORT gives
its nodes (a profiled node on another provider ran on a fallback); the browser flags it needs;
the device types it takes; how the page sets it up (`setup`: wasm | webgpu-adapter |
webnn-context); for a WebGPU EP, how long its device gets to answer the page's trivial dispatch
(`device_probe_s`, harness.web.device_probe); whether node placement is read from ORT's log; and
the sentence recorded on every row saying how the page checks that this EP is what ran. Adding an
EP is a row in that file (and a `setup` kind in runner.mjs if it needs a new one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TABLE = Path(__file__).parent / "page" / "eps.json"


@dataclass(frozen=True)
class BrowserEp:
    name: str
    bundle: str
    wasm_binary: str
    ort_provider: str  # the provider name ORT gives the EP in node placement and profiles
    flags: tuple[str, ...]
    device_types: tuple[str, ...]  # empty: the EP takes no device type
    setup: str
    # A WebGPU device that makes no progress hangs every ORT call on it until --timeout (lavapipe under
    # `--gpu on`: 300 s per page). A one-workgroup dispatch takes milliseconds on SwiftShader and on a GPU
    # (a cold shader compile included), so 10 s is far above any device that works and still a wait
    # paid once per EP setting, not once per case. None: the EP has no WebGPU device to prove.
    device_probe_s: float | None
    node_placement: bool
    check: str

    @property
    def runs_threads(self) -> bool:
        """The EP is the wasm runtime itself: each --threads count is a setting (a report column) of its own."""
        return self.setup == "wasm"

    @property
    def gpu_adapter(self) -> bool:
        """The EP runs on a WebGPU adapter, classified (software or hardware) and checked before each case."""
        return self.setup == "webgpu-adapter"


def _load() -> dict[str, BrowserEp]:
    rows = json.loads(TABLE.read_text())
    return {
        name: BrowserEp(
            name,
            row["bundle"],
            row["wasm_binary"],
            row["ort_provider"],
            tuple(row["flags"]),
            tuple(row["device_types"]),
            row["setup"],
            row["device_probe_s"],
            row["node_placement"],
            row["check"],
        )
        for name, row in rows.items()
    }


EPS = _load()
WEB_HARDWARE = tuple(EPS)  # wasm, webgpu, webnn: the table's order is the run's order (one launch per EP)
WEBNN_DEVICES = EPS["webnn"].device_types
