"""Each target's ceilings, measured through its own engine: the calibration graphs, their sizes, and their measurement.

A ceiling is what the target reaches on a graph whose work is known exactly, timed like a result
(harness.run.measure's loop natively; the page's performance.now loop in the browser, on the same files):
  bandwidth      Expand(x) -> E, Add(E, x) -> T, Slice(T) -> 16 values: E written, read, and T written per run
                 (3 x 4 bytes per element). x is a runtime scalar, so no engine folds the graph away at load
                 time; the file is tiny (nothing to fetch or check), and the Slice keeps the answer small (E and
                 T stay in the engine's own memory, as activations do).
  bandwidth_large  the same graph at BANDWIDTH_LARGE elements (two 256 MiB tensors live: well past this machine's 260
                 MiB L3, and any laptop's or phone's), measured after the floor: what a model whose bytes do not fit
                 in a cache sees (the floor's 64 MiB tensors fit in a server's L3). Sized at the rate of the
                 bandwidth ceiling just measured (a served device probes the floor first): a target whose large run
                 would take past SLACK budgets skips it, the ceiling holding why and no value.
  compute fp32   MatMul(X [M, K], W [K, N]) -> Slice: 2·M·K·N FLOPs per run.
  compute int4   MatMulNBits (ONNX Runtime's int4 weight-only MatMul, block 32) at the same shapes: what q4
                 rows compute with, where the engine has the kernel (elsewhere the row says why not).
Each graph is sized by time, not fixed (Sizing): a ladder of sizes, each about twice the work of the one below. A
probe times a warm run of the smallest; its rate picks the largest size whose run fits CEILING_BUDGET_MS, but no
further than the reference size (every ceiling's size before issue 46), which is probed in turn and whose rate
chooses the size measured (a few runs, at most CEILING_MAX_TIME_S of them). A fast target thus runs a large graph
(never a bandwidth graph inside a cache: a target that runs BANDWIDTH_FLOOR's 64 MiB tensors within SLACK
budgets runs them), a software adapter or a phone a small one, in seconds either way. Each ceiling states its
size (workload, amount), its budget and its probes. A graph an engine cannot run is recorded with the engine's
reason and holds no value. The figures: harness.core.roofline; reusing a ceiling measured earlier:
harness.run.ceiling_reuse.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from harness.core.records import Case, Ceiling, Target
from harness.core.roofline import BANDWIDTH_CLASS, ceiling_figures, precision_class
from harness.prepare.cache import cache_root
from harness.run.ceiling_check import Check, checked, now

if TYPE_CHECKING:  # graph_cost imports onnx: a worker counting a row pays for it, the planning parent does not
    from harness.core.graph_cost import Work

BLOCK = 32  # MatMulNBits' block size, as harness.prepare.variants quantizes q4
KEPT = 16  # values each graph answers with
CEILING_WARMUP, CEILING_ITERATIONS, CEILING_MIN_DURATION_S, CEILING_MIN_ITERATIONS = 1, 5, 0.1, 3
CEILING_MAX_ITERATIONS = 50  # a fast target's 0.1 s of samples
CEILING_MAX_TIME_S = 1.0  # per graph: a target slower than its smallest size stops at its minimum iterations
# The time one run of a calibration is sized to: long enough that a page's coarsest timer (0.1 ms) and its fixed cost
# per run (SwiftShader's WebGPU: ~10 ms of dispatch and read-back whatever the size, measured here) stay small beside
# it, short enough that a graph's first run, warm-up and ~5 timed runs stay near 0.35 s (docs/measurement.md).
CEILING_BUDGET_MS = 50.0
# A probed run of at least this share of the budget (2.5 ms: 25 steps of a page's coarsest timer) is long enough to be
# measured as it is. Moving on costs a load and its first runs, and here gave another figure, not a better one: on
# this 2-core CPU, quiet, the 128 MiB bandwidth graph 16.0 GB/s against the 64 MiB one's 18.6, the 8.6 GFLOP MatMul
# 329 GFLOP/s against 351 for 1.07 GFLOP. So a CPU and wasm keep the sizes every ceiling had before; a GPU grows.
# (Below the reference size a graph still grows to the budget: a slow target's small runs are mostly fixed cost.)
ENOUGH = 0.05
# Budgets a run may take where the budget alone would shrink the graph: the bandwidth floor's (rather than fit a
# cache), and the reference size's when the smallest size's rate predicts it (pessimistic: wasm's MatMulNBits ran
# the smallest size slower than the reference one): the reference is probed then, and its own rate chooses.
SLACK = 4.0
PROBE_RUNS = 2  # timed runs of a probe, the faster taken: one descheduled moment does not shrink a graph
MAX_PROBES = 2  # the smallest size, then at most the reference size: then the size is chosen
CALIBRATION_VERSION = 2  # part of what a reused ceiling must match: bump when a graph or the sizing changes
SEED = 20261126

# Elements of each bandwidth tensor: 256 Ki to 32 Mi fp32 values (1 to 128 MiB; two such tensors live at once). A
# target that runs the 16 Mi one (64 MiB, well past a laptop's or phone's last-level cache) within SLACK
# budgets never runs a smaller one.
BANDWIDTH_SIZES = tuple(2**k for k in range(18, 26))
BANDWIDTH_FLOOR = BANDWIDTH_SIZES.index(16 * 2**20)
# Elements of each tensor of the bandwidth_large graph: 64 Mi fp32 values, 256 MiB; E and T, 512 MiB, live at once.
BANDWIDTH_LARGE = 64 * 2**20
# (M, K, N) of the MatMuls: 8.4 MFLOP to 34 GFLOP, each about twice the one before; K a multiple of BLOCK.
MATMUL_SIZES = (
    (64, 256, 256), (128, 256, 256), (256, 256, 256), (128, 512, 512), (256, 512, 512), (512, 512, 512),
    (256, 1024, 1024), (512, 1024, 1024), (1024, 1024, 1024), (512, 2048, 2048), (1024, 2048, 2048),
    (2048, 2048, 2048), (4096, 2048, 2048),
)  # fmt: skip
MATMUL_REFERENCE = MATMUL_SIZES.index((512, 1024, 1024))  # 1.07 GFLOP


@dataclass(frozen=True)
class Size:
    """One size of a calibration: its graph's name (the ceiling's workload), dimensions, and work per run."""

    name: str
    dims: tuple[int, ...]  # bandwidth: (elements,); compute: (M, K, N)
    amount: float  # bytes moved or FLOPs per run


@dataclass(frozen=True)
class Calibration:
    kind: str  # bandwidth | compute
    precision: str  # compute: the precision class; bandwidth: BANDWIDTH_CLASS
    sizes: tuple[Size, ...]  # smallest first
    build: Callable[[tuple[int, ...]], Any]  # the onnx.ModelProto of a size's dims
    reference: int  # the size the first jump goes no further than: the one every ceiling had before issue 46
    floor: int = 0  # the smallest size a target that runs it within SLACK budgets is measured at
    # The smallest size this calibration may measure (bandwidth_large: its one size past a cache): the bandwidth
    # ceiling's rate, or its first probe's, decides (Sizing.take), and a choice below it is not measured (skipped).
    least: int = 0
    # Timed runs of its measurement (at least CEILING_MIN_DURATION_S of them): bandwidth_large's 65 ms runs need no 5
    # to find the fastest (spread 0.8% here), and its first runs touch 512 MiB of fresh pages (~0.25 s) besides.
    iterations: int = CEILING_ITERATIONS


def _model(
    nodes: list[Any], inputs: list[Any], initializers: list[Any], name: str, domains: tuple[str, ...] = ()
) -> Any:
    from onnx import TensorProto, helper

    dims = [KEPT] if name == "bandwidth" else [1, KEPT]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    graph = helper.make_graph(nodes, name, inputs, [output], initializers)
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, 1) for d in domains)]
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8  # readable by every onnxruntime and OpenVINO release the harness supports
    return model


def _slice(source: str, dims: int) -> tuple[list[Any], list[Any]]:
    """A Slice keeping the first KEPT values of the last axis (and the first row of the others)."""
    from onnx import helper, numpy_helper

    starts = numpy_helper.from_array(np.zeros(dims, np.int64), "starts")
    ends = numpy_helper.from_array(np.array([1] * (dims - 1) + [KEPT], np.int64), "ends")
    return [helper.make_node("Slice", [source, "starts", "ends"], ["y"])], [starts, ends]


def bandwidth_graph(dims: tuple[int, ...]) -> Any:
    from onnx import TensorProto, helper, numpy_helper

    shape = numpy_helper.from_array(np.array(dims, np.int64), "shape")
    sliced, constants = _slice("t", 1)
    nodes = [helper.make_node("Expand", ["x", "shape"], ["e"]), helper.make_node("Add", ["e", "x"], ["t"]), *sliced]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    return _model(nodes, [x], [shape, *constants], "bandwidth")


def _activations(m: int, k: int) -> Any:
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])


def matmul_graph(dims: tuple[int, ...]) -> Any:
    from onnx import helper, numpy_helper

    m, k, n = dims
    rng = np.random.default_rng(SEED)
    weight = numpy_helper.from_array((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), "w")
    sliced, constants = _slice("t", 2)
    return _model([helper.make_node("MatMul", ["x", "w"], ["t"]), *sliced], [_activations(m, k)],
                  [weight, *constants], "matmul-fp32")  # fmt: skip


def matmul_int4_graph(dims: tuple[int, ...]) -> Any:
    from onnx import helper, numpy_helper

    m, k, n = dims
    rng = np.random.default_rng(SEED)
    blocks = numpy_helper.from_array(rng.integers(0, 256, (n, k // BLOCK, BLOCK // 2), dtype=np.uint8), "b")
    scales = numpy_helper.from_array(np.full(n * k // BLOCK, 0.01, np.float32), "scales")
    node = helper.make_node("MatMulNBits", ["x", "b", "scales"], ["t"], domain="com.microsoft",
                            K=k, N=n, bits=4, block_size=BLOCK)  # fmt: skip
    sliced, constants = _slice("t", 2)
    return _model([node, *sliced], [_activations(m, k)], [blocks, scales, *constants], "matmul-int4",
                  ("com.microsoft",))  # fmt: skip


def _bandwidth_size(n: int) -> Size:
    return Size(f"bandwidth-expand-add-{4 * n // 2**20}mib", (n,), 3.0 * 4 * n)


def _bandwidth_sizes() -> tuple[Size, ...]:
    return tuple(_bandwidth_size(n) for n in BANDWIDTH_SIZES)


def _matmul_sizes(stem: str) -> tuple[Size, ...]:
    return tuple(Size(f"{stem}-{m}x{k}x{n}", (m, k, n), 2.0 * m * k * n) for m, k, n in MATMUL_SIZES)


# bandwidth_large's: the floor, probed where no bandwidth ceiling's rate is at hand; the size it measures
LARGE_SIZES = (_bandwidth_sizes()[BANDWIDTH_FLOOR], _bandwidth_size(BANDWIDTH_LARGE))
# One entry per ceiling a target gets: a new one (fp16, int8) is one line here.
CALIBRATIONS = (
    Calibration("bandwidth", BANDWIDTH_CLASS, _bandwidth_sizes(), bandwidth_graph, BANDWIDTH_FLOOR, BANDWIDTH_FLOOR),
    Calibration("bandwidth_large", BANDWIDTH_CLASS, LARGE_SIZES, bandwidth_graph, 1, 1, 1, CEILING_MIN_ITERATIONS),
    Calibration("compute", "fp32", _matmul_sizes("matmul-fp32"), matmul_graph, MATMUL_REFERENCE),
    Calibration("compute", "int4", _matmul_sizes("matmulnbits-int4"), matmul_int4_graph, MATMUL_REFERENCE),
)


def calibration_feeds(calibration: Calibration, size: Size) -> dict[str, np.ndarray]:
    if calibration.precision == BANDWIDTH_CLASS:  # either bandwidth graph
        return {"x": np.ones(1, np.float32)}
    m, k, _ = size.dims
    return {"x": np.random.default_rng(SEED + 1).standard_normal((m, k)).astype(np.float32)}


@cache
def calibration_path(calibration: Calibration, size: Size) -> Path:
    """The size's ONNX file in the cache, written once (atomically: workers may race to write it)."""
    import onnx

    path = cache_root() / "ceilings" / f"{size.name}.onnx"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        onnx.save(calibration.build(size.dims), partial)
        partial.replace(path)
    return path


def _work(calibration: Calibration, amount: float) -> str:
    unit = "B" if calibration.precision == BANDWIDTH_CLASS else "FLOP"
    scaled = next((amount / f, p) for f, p in ((1e9, "G"), (1e6, "M"), (1e3, "k"), (1, "")) if amount >= f)
    return f"{scaled[0]:.3g} {scaled[1]}{unit}"


@dataclass
class Sizing:
    """Where a calibration stands in its ladder: the size to run next, and the probes so far ((size index, ms of
    one warm run)). A probe's rate gives the largest size that runs within the budget (the smallest if none does;
    the bandwidth floor if it runs within SLACK budgets). The first probe runs the smallest size, whose rate (a
    graph inside a cache, or mostly a run's fixed cost) says little of a large one's: its jump goes no further
    than the reference size, and to it where that rate puts its run within SLACK budgets; probed in turn. A
    probed size from the reference up whose run takes ENOUGH of the budget, and no more, stays. Done once the
    choice is no larger than the size just probed, or MAX_PROBES are spent; `index` is then the size to measure."""

    calibration: Calibration
    budget_ms: float = field(default_factory=lambda: CEILING_BUDGET_MS)  # read when made (a test plants a budget)
    index: int = 0
    probes: list[tuple[int, float]] = field(default_factory=list)
    done: bool = False
    why: str = "not probed"  # the rule that chose the size, in words (note())
    rate: tuple[float, str] | None = None  # a one-size calibration's: (work per ms, where that rate was measured)

    @property
    def size(self) -> Size:
        return self.calibration.sizes[self.index]

    def observe(self, ms: float) -> None:
        self.probes.append((self.index, ms))
        if self.calibration.least:  # one size to measure: the first probe says only whether it fits the time rules
            return self.take(self.size.amount / max(ms, 1e-6), "its probe")
        per_ms = self.size.amount / max(ms, 1e-6)
        choice, self.why = self.fitting(per_ms)
        reference = self.calibration.reference
        if len(self.probes) == 1 and self.index < reference:
            near = self.calibration.sizes[reference].amount / max(per_ms, 1e-9) <= SLACK * self.budget_ms
            choice = reference if near or choice >= reference else choice
        if ENOUGH * self.budget_ms <= ms <= self.budget_ms and self.index >= reference:
            choice = self.index  # long enough, within the budget, no smaller than before: measured as it is
            self.why = f"its probe ran {ENOUGH * self.budget_ms:g} ms to the budget: long enough as it is"
        self.done = choice <= self.index or len(self.probes) >= MAX_PROBES
        self.index = choice

    def take(self, per_ms: float, source: str) -> None:
        """A one-size calibration (`least`) sized from a rate (work per ms) measured at `source` (its probe, or the
        bandwidth ceiling just measured on the target: the same graph, no run spent on a probe): done."""
        self.index, self.why = self.fitting(per_ms, f"the rate of {source}")
        self.rate, self.done = (per_ms, source), True

    def fitting(self, per_ms: float, at: str = "the last probe's rate") -> tuple[int, str]:
        """The largest size whose run takes at most the budget at `per_ms` (work per ms), else the smallest; and
        why, in words."""
        sizes, floor = self.calibration.sizes, self.calibration.floor
        choice = max((i for i, size in enumerate(sizes) if size.amount / per_ms <= self.budget_ms), default=None)
        if (choice is None or choice < floor) and sizes[floor].amount / per_ms <= SLACK * self.budget_ms:
            return floor, f"the floor, its run within {SLACK:g} budgets at {at}: past a cache"
        if choice is None:
            return 0, f"the smallest: no size's run fits the budget at {at}"
        return choice, f"the largest whose run fits the budget at {at}"

    @property
    def skipped(self) -> str | None:
        """Why the chosen size is not measured (below the calibration's least: its run would take too long), else
        None."""
        if self.rate is None or self.index >= self.calibration.least:
            return None
        least = self.calibration.sizes[self.calibration.least]
        return (
            f"not measured: at the rate of {self.rate[1]} a run of {least.name} would take "
            f"{least.amount / self.rate[0]:.3g} ms, past {SLACK:g} budgets of {self.budget_ms:g} ms (a target this "
            "slow keeps only the smaller graph's)"
        )

    def probed(self) -> str:
        if not self.probes and self.rate is not None:
            return f"not probed: sized at the rate of {self.rate[1]} ({_work(self.calibration, self.rate[0] * 1e3)}/s)"
        return "probed " + ", ".join(f"{_work(self.calibration, self.calibration.sizes[i].amount)} in {ms:.3g} ms"
                                     for i, ms in self.probes)  # fmt: skip

    def note(self) -> str:
        """How the size was chosen, stored with the ceiling."""
        return f"{self.probed()}; measured {self.size.name} ({self.budget_ms:g} ms budget): {self.why}"

    def unmeasured(self, ceiling: Ceiling) -> Ceiling:
        """A skipped calibration's ceiling (new_ceiling's: its least size): no value, why, its budget and probes."""
        return replace(ceiling, error=self.skipped, budget_ms=self.budget_ms, sizing=self.probed())

    def stated(self, ceiling: Ceiling) -> Ceiling:
        """The ceiling of the chosen size, stating it: its workload, amount, budget and probes."""
        return replace(ceiling, workload=self.size.name, amount=self.size.amount, budget_ms=self.budget_ms,
                       sizing=self.note())  # fmt: skip


@dataclass(frozen=True)
class Prior:
    """A ceiling measured earlier on this machine that a calibration may take instead of measuring
    (harness.run.ceiling_reuse finds them): this run's own (a resumed run: nothing to store again), or another
    run's within the reuse age (stored again in this run as a copy naming that run, measured_at the original's)."""

    ceiling: Ceiling
    own: bool


def reusable(prior: Sequence[Prior], calibration: Calibration, software: str) -> Prior | None:
    """The earlier ceiling of the calibration measured with the same software at one of its sizes: this run's own
    first, else the fastest (a ceiling is the most the target was seen to sustain), which harness.run.ceiling_check
    checks before it is reused."""
    names = {size.name for size in calibration.sizes}
    same = [p for p in prior if (p.ceiling.kind, p.ceiling.precision, p.ceiling.software) ==
            (calibration.kind, calibration.precision, software) and p.ceiling.workload in names]  # fmt: skip
    return max(same, key=lambda p: (p.own, ceiling_figures(p.ceiling.amount, p.ceiling.samples_ms)[0] or 0.0),
               default=None)  # fmt: skip


def check_size(calibration: Calibration, prior: Ceiling) -> Size:
    """The size a prior ceiling measured (reusable keeps only priors at one of the calibration's sizes)."""
    return next(size for size in calibration.sizes if size.name == prior.workload)


def new_ceiling(target: Target, calibration: Calibration) -> Ceiling:
    """The ceiling a calibration will give, at the smallest size it may measure until one is chosen."""
    first = calibration.sizes[calibration.least]
    return Ceiling(target, calibration.kind, calibration.precision, first.name, first.amount)


def engine_software(facts: dict[str, Any]) -> str:
    """What measured a native ceiling, from the session's own facts: the calibrations' version and every engine
    version the session names (onnxruntime_version, openvino_version…). The target holds the EP and threads."""
    versions = [f"{k}={v}" for k, v in sorted(facts.items()) if k.endswith("_version") and isinstance(v, str)]
    return "; ".join([f"calibration {CALIBRATION_VERSION}", *versions])[:500]


# Set to 1, --no-ceilings is every run's default: a test suite's hundreds of runs each paid its targets'
# calibration (1-2 s a native target, a few seconds a page setting) though few read a ceiling.
NO_CEILINGS_ENV = "ACCELHARNESS_NO_CEILINGS"
# Set to 1, no run measures bandwidth_large (its row is not stored; predict holds bytes against the bandwidth ceiling
# alone, as before it): ~0.6-1.3 s a target, which each test run that turns ceilings on for another reason would pay.
NO_LARGE_ENV = "ACCELHARNESS_NO_BANDWIDTH_LARGE"


def ceilings_asked(no_ceilings: bool, only: bool = False) -> bool:
    """Whether a run measures its targets' ceilings: unless --no-ceilings, or ACCELHARNESS_NO_CEILINGS=1 (a default
    that --ceilings-only, `only`, overrides: it asks for nothing else)."""
    return not no_ceilings and (only or os.environ.get(NO_CEILINGS_ENV) != "1")


def wanted(precisions: Iterable[str | None], measured: set[tuple[str, str]], asked: bool = True) -> list[Calibration]:
    """The calibrations a target's cases need that it has not had in this run (`measured`: (kind, class)
    pairs, updated): the bandwidth (and bandwidth_large, unless ACCELHARNESS_NO_BANDWIDTH_LARGE=1), and the compute
    ceiling of each precision class its rows run in; none where the run does not measure ceilings (`asked`:
    ceilings_asked)."""
    if not asked:
        return []
    classes = {BANDWIDTH_CLASS} | {precision_class(p) for p in precisions}
    skip = {"bandwidth_large"} if os.environ.get(NO_LARGE_ENV) == "1" else set()
    found = [c for c in CALIBRATIONS if c.precision in classes and (c.kind, c.precision) not in measured
             and c.kind not in skip]  # fmt: skip
    measured.update((c.kind, c.precision) for c in found)
    return found


def measure_ceilings(
    backend: Any, target: Target, calibrations: Iterable[Calibration], prior: Sequence[Prior] = ()
) -> Iterator[Ceiling]:
    """The calibrations on the target, each sized (Sizing) and measured, its sessions loaded and dropped in turn; one
    measured earlier with the same software (`prior`, the target's: harness.run.ceiling_reuse) is taken instead;
    one the engine cannot run holds its reason."""
    from harness.core.failures import classify

    software: list[str] = []  # the engine's (engine_software), read from the first session loaded
    load = _Loader(backend, target)
    done: list[Ceiling | None] = []
    for calibration in calibrations:
        started = time.perf_counter()
        try:
            found = _calibrate(load, target, calibration, prior, software, seen_rate(done))
        except Exception as exc:  # a ceiling failing is recorded, and never stops the job
            found = new_ceiling(target, calibration)
            found.error = classify(exc)[1]
        if found is not None and found.reused_from is None:
            found.calibration_s = time.perf_counter() - started
        done.append(found)
        if found is not None:  # None: this run holds it already (resumed)
            yield found


def seen_rate(ceilings: Iterable[Ceiling | None]) -> tuple[float, str] | None:
    """The rate of the target's bandwidth ceiling among `ceilings` (this run's, or copied), which sizes its
    bandwidth_large (Sizing.take) in place of a probe: (bytes per ms at its fastest run, in words); None without."""
    for ceiling in ceilings:
        if ceiling is not None and ceiling.kind == "bandwidth" and ceiling.samples_ms:
            return ceiling.amount / min(ceiling.samples_ms), f"the bandwidth ceiling's {ceiling.workload}"
    return None


def _calibrate(
    load: _Loader,
    target: Target,
    calibration: Calibration,
    prior: Sequence[Prior],
    software: list[str],
    seen: tuple[float, str] | None = None,
) -> Ceiling | None:
    from harness.run.measure import MeasureConfig, measure
    from harness.run.memory import PeakRss

    sizing = Sizing(calibration)
    session, feeds = load(calibration, sizing.size)
    software[:] = software or [engine_software(session.facts)]
    if (earlier := reusable(prior, calibration, software[0])) is not None:
        if earlier.own:  # a resumed run's own: stored already
            return None
        session = None  # one graph's tensors in memory at a time
        if (check := _quick_check(load, calibration, earlier.ceiling)).stands:
            return checked(check)
        return checked(check, _calibrate(load, target, calibration, (), software, seen))  # measured afresh
    loaded = sizing.index
    if calibration.least and seen is not None:
        sizing.take(*seen)
    while not sizing.done:
        sizing.observe(_probe(session, feeds))
        if sizing.index != loaded and not sizing.skipped:  # the next size to probe, or the one chosen
            session = None  # one graph's tensors in memory at a time
            (session, feeds), loaded = load(calibration, sizing.size), sizing.index
    if sizing.skipped:  # its one size would not fit the time rules: the ceiling says why, with no value
        return replace(sizing.unmeasured(new_ceiling(target, calibration)), software=software[0])
    if sizing.index != loaded:  # sized without a probe
        session = None
        session, feeds = load(calibration, sizing.size)
    config = MeasureConfig(CEILING_WARMUP, calibration.iterations, CEILING_MIN_DURATION_S, CEILING_MAX_ITERATIONS,
                           min_iterations=CEILING_MIN_ITERATIONS, max_time_s=CEILING_MAX_TIME_S)  # fmt: skip
    measured = measure(session, feeds, config, PeakRss())
    ceiling = sizing.stated(new_ceiling(target, calibration))
    ceiling.samples_ms, ceiling.load_avg_1m, ceiling.software = measured.samples_ms, measured.load_avg_1m, software[0]
    return ceiling


def _quick_check(load: _Loader, calibration: Calibration, prior: Ceiling) -> Check:
    """The prior's own size run as a probe is, through the target's engine (harness.run.ceiling_check)."""
    started = time.perf_counter()
    session, feeds = load(calibration, check_size(calibration, prior))
    fastest_ms = _probe(session, feeds)
    return Check(prior, fastest_ms, time.perf_counter() - started, now())


@dataclass
class _Loader:
    """Loads a target's calibration graphs as its rows' sessions are loaded (an engine that runs no ONNX file, torch,
    through its backend's load_calibration: the graph's ops as its own): the EP apart from its thread count
    (harness.core.threads.split_threads: the count the target names runs), the machine's other load read once per
    target for an engine that reads it (a 0.2 s window: per load, it was most of a fast target's calibration)."""

    backend: Any
    target: Target
    busy: float | None = None
    read: bool = False

    def __call__(self, calibration: Calibration, size: Size) -> tuple[Any, dict[str, np.ndarray]]:
        from harness.core.threads import split_threads
        from harness.native import capabilities
        from harness.native.base import LoadRequest, others_busy_cpus
        from harness.prepare.specs import spec_from_path

        if not self.read and capabilities(self.target.engine).reads_machine_load:
            self.busy, self.read = others_busy_cpus(), True
        target, threads = split_threads(self.target)
        path, feeds = calibration_path(calibration, size), calibration_feeds(calibration, size)
        if (own := getattr(self.backend, "load_calibration", None)) is not None:  # an engine that runs no ONNX file
            return own(path, target, threads), feeds  # (torch): the graph's ops as its own
        request = LoadRequest(spec_from_path(path, None), path, "fp32", feeds, threads=threads,
                              others_busy_cpus=self.busy)  # fmt: skip
        return self.backend.load(request, target), feeds


def _probe(session: Any, feeds: dict[str, np.ndarray]) -> float:
    """A warm run's ms, by the session's own clock as measure() times: the faster of PROBE_RUNS after two untimed
    runs, as measure()'s first run and warm-up (and the page's) come before its samples. ORT's CPU EP took 56 and
    57 ms for the 64 MiB bandwidth graph's first two runs (its arena's pages touched), then 11-13 ms."""
    prepared = session.prepare(feeds)
    session.run(prepared)
    session.run(prepared)
    times = []
    for _ in range(PROBE_RUNS):
        session.clock.start()
        session.run(prepared)
        times.append(session.clock.stop())
    return min(times)


def row_work(model: Path | None, case: Case, input_shapes: dict[str, list[int]]) -> Work:
    """(work fields, details) of a measured row from the file it ran (harness.core.graph_cost), the fields and
    facts a count gives and no other key (harness.prepare.work_memo.only_work); a graph that cannot be counted
    leaves the fields NULL and says why, never a guess."""
    if model is None:
        return {}, {"work_counted": "not counted: no ONNX file known to have run (an engine building its own model)"}
    if model.suffix == ".gguf":  # llama.cpp's GGUF (given as the model, or written from it): counted from its tensors
        from harness.prepare.gguf_file import NOT_COUNTED, GgufError, gguf_generation_work

        if case.mode != "generate":
            return {}, {"work_counted": NOT_COUNTED}
        try:
            return gguf_generation_work(model, case.batch_size, case.seq_len, case.depth or 0, case.new_tokens or 0)
        except GgufError as exc:
            return {}, {"work_counted": f"not counted: {exc}"}
    from harness.prepare.work_memo import only_work, remembered_work

    if case.mode not in ("generate", "inference"):
        return {}, {}
    try:  # only the work fields and facts, by name: nothing remembered sets another field of the row
        work, source = remembered_work(model, _workload(model, case, input_shapes),
                                       lambda: _count(model, case, input_shapes))  # fmt: skip
        fields, facts = only_work(work)
        return fields, facts | {"work_source": source}
    except Exception as exc:  # the graph's own words are the reason
        return {}, {"work_counted": f"not counted: {type(exc).__name__}: {exc}"}


def _workload(model: Path, case: Case, input_shapes: dict[str, list[int]]) -> dict[str, Any]:
    """Everything a count depends on besides the file's bytes (harness.prepare.work_memo's key)."""
    from harness.prepare.folders import past_shape

    shape = past_shape(model) if case.mode == "generate" else None
    return {"mode": case.mode, "batch": case.batch_size, "prompt": case.seq_len, "depth": case.depth,
            "new_tokens": case.new_tokens, "input_shapes": input_shapes, "past_shape": shape}  # fmt: skip


def _count(model: Path, case: Case, input_shapes: dict[str, list[int]]) -> Work:
    from harness.core.graph_cost import generation_work, inference_work
    from harness.prepare.folders import past_shape

    if case.mode == "generate":
        return generation_work(model, case.batch_size, case.seq_len or 1, case.depth or 0, case.new_tokens or 1,
                               past_shape(model))  # fmt: skip
    return inference_work(model, input_shapes, case.batch_size)
