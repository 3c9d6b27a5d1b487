"""Suites on a Ray cluster: each (model, hardware) job is a Ray task on a node that offers that hardware.

A node says what it can benchmark with a custom resource named after the hardware
(`ray start --address HEAD:6379 --resources '{"cuda": 1}'`); a job asks for one unit of the resource
named after its target's hardware, so Ray places it on such a node, and the count is how many jobs
of that hardware the node runs at once. The task streams each Result back as its case completes; the
driver (`accelharness suite --ray-address …`) is the single DuckDB writer. Every row records the
node it ran on in details["ray_node"].

Ray is imported only when --ray-address is given (the optional `accelharness[ray]` extra).
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table

from harness.browser.execute import execute_web
from harness.browser.run import WebPlan
from harness.core.bounds import MAX_PLATFORM_REASON_CHARS
from harness.core.failures import classify
from harness.core.records import Case, Ceiling, Control, Result, Target, result_key
from harness.prepare.prepared import unprepared_result
from harness.prepare.specs import ModelSpec
from harness.run.hardware import PlatformStatus
from harness.run.native import execute_native
from harness.run.plan import Plan, RequestError
from harness.run.recording import Body, Emit
from harness.suite.plan import HOST, SuitePlan, device_group
from harness.web.eps import WEB_HARDWARE

INSTALL_HINT = "pip install 'accelharness[ray]'"
# Resources Ray defines on every node itself; everything else a node offers is a custom resource.
RAY_OWN = ("CPU", "GPU", "memory", "object_store_memory")
RAY_OWN_PREFIXES = ("node:", "accelerator_type:")
CONNECT_TIMEOUT_S = 5.0
POLL_S = 1.0  # ray.wait wakes this often, so Ctrl-C on the driver is handled promptly


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RequestError(f"--ray-address needs Ray: install the ray extra: {INSTALL_HINT}") from exc
    return ray


def check_reachable(address: str) -> None:
    """Fail fast on a HOST:PORT where nothing listens: ray.init retries such an address for minutes."""
    host, _, port = address.rpartition(":")
    if address == "auto" or "://" in address or not port.isdigit():
        return  # "auto" finds the local cluster itself, and fails at once when there is none
    try:
        socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise RequestError(
            f"--ray-address {address}: no Ray cluster answers there ({exc}); start its head with: "
            f"ray start --head --port {port}"
        ) from exc


def connect(address: str) -> Any:
    """The ray module, connected to the cluster at address ("auto" or HOST:PORT); an existing
    connection (ray.init done by the caller, e.g. a test) is used as it is."""
    ray = import_ray()
    if not ray.is_initialized():
        check_reachable(address)
        try:
            ray.init(address=address, logging_level=logging.WARNING)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise RequestError(f"--ray-address {address}: cannot connect to a Ray cluster: {exc}") from exc
    return ray


# --- jobs: what one Ray task runs ------------------------------------------------------------------


@dataclass(frozen=True)
class NativeJob:
    """One model on one native target; the plan is already narrowed to them."""

    plan: Plan
    spec: ModelSpec
    target: Target

    @property
    def resource(self) -> str:
        return self.target.hardware

    @property
    def label(self) -> str:
        return f"{self.spec.name} {self.target.label}"

    def expected(self) -> list[tuple[Target, Case]]:
        return [(self.target, case) for case in self.plan.remaining(self.spec, self.target)]

    def host_compute(self) -> bool:
        return device_group(self.target) == HOST

    def body(self) -> Body:
        """Runs on the node: the target is probed again there (the driver's probe said nothing about it)."""
        from harness.core.threads import split_threads
        from harness.native.base import Availability
        from harness.run.hardware import native_targets

        probed = dict(native_targets([self.target.hardware], [self.target.engine]))
        engine_target, _ = split_threads(self.target)  # probed as the engine knows it, run at its thread count
        availability = probed.get(engine_target, Availability(False, f"{self.target.engine} does not serve it here"))
        return execute_native(dataclasses.replace(self.plan, targets=[(self.target, availability)]))


@dataclass(frozen=True)
class WebJob:
    """One model on one browser platform (all its settings, e.g. wasm at 1 and 2 threads)."""

    plan: WebPlan
    hardware: str

    @property
    def resource(self) -> str:
        return self.hardware

    @property
    def spec(self) -> ModelSpec:
        return self.plan.specs[0]

    @property
    def label(self) -> str:
        return f"{self.spec.name} {self.hardware}"

    def expected(self) -> list[tuple[Target, Case]]:
        return [(s.target, case) for s in self.plan.settings for case in self.plan.remaining(self.spec, s)]

    def host_compute(self) -> bool:
        return True  # headless Chromium computes on the node's cores (WebGPU there is SwiftShader)

    def body(self) -> Body:
        """Runs on the node: the browser is found again there (the driver's binary path means nothing here);
        a node without one fails the task, and the driver records the reason on every case."""
        from harness.browser.run import launched_choices
        from harness.web.driver import resolve_browser
        from harness.web.launched import LAUNCHED_BROWSERS
        from harness.web.server import dist_files

        request = self.plan.request
        chromium = [b for b in request.browsers if b not in LAUNCHED_BROWSERS]
        browser = chromium and resolve_browser(chromium[0], request.browser_path, headless=not request.headed)
        dist_files()
        launched = tuple(launched_choices(request))
        return execute_web(dataclasses.replace(self.plan, browser=browser or None, launched=launched))


Job = NativeJob | WebJob


def plan_jobs(plan: SuitePlan) -> list[Job]:
    """One job per (model, native target) and per (model, browser platform) that has cases left to run."""
    jobs: list[Job] = []
    for spec in plan.native.specs if plan.native else []:
        for target, availability in plan.native.targets:
            narrowed = dataclasses.replace(plan.native, specs=[spec], targets=[(target, availability)])
            jobs.append(NativeJob(narrowed, spec, target))
    for spec in plan.web.specs if plan.web else []:
        for hardware in dict.fromkeys(s.ep for s in plan.web.settings):
            settings = [s for s in plan.web.settings if s.ep == hardware]
            jobs.append(WebJob(dataclasses.replace(plan.web, specs=[spec], settings=settings), hardware))
    return [job for job in jobs if job.expected()]


def demand(job: Job) -> dict[str, float]:
    """The resources a job's task asks for.

    A job whose benchmark computes on the node's cores (CPU engines, OpenVINO CPU, the browser) also
    takes one Ray CPU slot: a node started with --num-cpus 1 then runs its CPU benchmarks one after
    another, so no two of them share cores and pollute each other's timings (the same rule as the
    local host-cpu device group). A job on an accelerator takes no CPU slot, so a GPU node's CUDA
    job runs beside its CPU job instead of queueing behind it."""
    return {job.resource: 1.0, "CPU": 1.0 if job.host_compute() else 0.0}


# --- the node side ---------------------------------------------------------------------------------


def node_facts() -> dict[str, Any]:
    """The node a task runs on, recorded on each of its rows (the run's host facts describe the driver)."""
    import ray

    from harness.run.provenance import host_facts

    facts = {k: v for k, v in host_facts().items() if k != "load_avg_at_start"}
    return facts | {"node_id": ray.get_runtime_context().get_node_id(), "node_ip": ray.util.get_node_ip_address()}


def run_job_streaming(job: Job) -> Iterator[Result | Control]:
    """The Ray task: run the job's body and yield each Result as it is emitted.

    The bodies call emit synchronously from deep inside their loops, so the body runs in a thread
    and hands Results to this generator through a queue; an exception in the body is re-raised here
    and reaches the driver as the task's failure."""
    node = node_facts()
    items: queue.Queue[Result | Control | BaseException | None] = queue.Queue()

    def run() -> None:
        try:
            job.body()(items.put)
        except BaseException as exc:
            items.put(exc)
        finally:
            items.put(None)

    threading.Thread(target=run, name=f"job {job.label}", daemon=True).start()
    while (item := items.get()) is not None:
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, Control | Ceiling | PlatformStatus):  # a drift control, a ceiling, a browser platform
            yield item
            continue
        item.details["ray_node"] = node
        item.details["ray_resource"] = job.resource
        yield item


# --- the driver side -------------------------------------------------------------------------------


def alive_nodes(ray: Any) -> list[dict[str, Any]]:
    return [node for node in ray.nodes() if node.get("Alive")]


def head_address(ray: Any) -> str:
    """The address a new node joins with (`ray start --address …`)."""
    return ray.get_runtime_context().gcs_address or "HEAD:6379"


def infeasible(job: Job, nodes: list[dict[str, Any]], head: str = "HEAD:6379") -> str | None:
    """Why no node can ever take the job's task (Ray would queue it forever), or None when one can."""
    wanted = demand(job)
    if any(all(node["Resources"].get(k, 0) >= v for k, v in wanted.items()) for node in nodes):
        return None
    hint = f"start one with: ray start --address {head} --resources '{{\"{job.resource}\": 1}}'"
    if not any(node["Resources"].get(job.resource, 0) >= 1 for node in nodes):
        return f"no Ray node offers resource '{job.resource}' ({hint})"
    return f"the Ray nodes offering '{job.resource}' have no CPU for a job on the host's cores ({hint} --num-cpus 1)"


def _rows(job: Job, cases: list[tuple[Target, Case]], status: str, message: str) -> list[Result]:
    return [unprepared_result(job.spec, t, c, status, message, {"ray_resource": job.resource}) for t, c in cases]


def failure_text(exc: BaseException) -> str:
    """The error a failed task leaves on its unreported cases: the body's own exception when it raised,
    else Ray's (a lost node, a killed worker)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return classify(cause)[1]
    return f"{type(exc).__name__}: {exc}".strip()[:2000]


class _Tracked:
    """A running job and the result keys its task has reported so far."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.reported: set[str] = set()

    def finish(self, emit: Emit, message: str) -> None:
        """The task ended: every case it never reported gets an `error` row saying why."""
        name = self.job.spec.name
        missing = [(t, c) for t, c in self.job.expected() if result_key(name, t, c) not in self.reported]
        for row in _rows(self.job, missing, "error", message):
            emit(row)

    def unknown(self, item: Any) -> str | None:
        """Why a streamed item does not stand for one of this job's unreported cases, or None."""
        if not isinstance(item, Result):
            return f"a {type(item).__name__}, not a Result"
        if not (isinstance(item.model, str) and isinstance(item.target, Target) and isinstance(item.case, Case)):
            return "a Result without a model name, Target and Case"
        expected = {result_key(self.job.spec.name, t, c) for t, c in self.job.expected()}
        if item.key not in expected - self.reported:
            return f"a result for {item.key}, which is not one of its cases still to report"
        return None

    def checked(self, result: Result) -> Result:
        """The result as it came, or an `error` row for its case naming the invariants it breaks:
        it was built on another machine and arrived unpickled, never through Result.__post_init__."""
        problems = result.problems()
        if not problems:
            return result
        node = result.details.get("ray_node") if isinstance(result.details, dict) else None
        node = node if isinstance(node, dict) else {}
        where = f"Ray node {node.get('hostname', '?')} ({node.get('node_ip', '?')})"
        message = f"the result from {where} failed validation on the driver: {'; '.join(problems)}"
        (row,) = _rows(self.job, [(result.target, result.case)], "error", message)
        row.details["ray_node"] = node
        return row


def _well_formed(status: PlatformStatus) -> bool:
    """A node's browser platform arrived unpickled: a known platform, typed fields, a bounded reason."""
    typed = isinstance(status.available, bool) and isinstance(status.device_name, str | None)
    reason = isinstance(status.reason, str) and len(status.reason) <= MAX_PLATFORM_REASON_CHARS
    return status.platform in WEB_HARDWARE and typed and reason


def _take_next(ray: Any, generator: Any, tracked: _Tracked, emit: Emit) -> bool:
    """Emit the generator's next Result, checked again here; False once its task has ended (its
    leftovers recorded) or sent something that is not one of its cases' results (then it is stopped)."""
    label = tracked.job.label
    try:
        result = ray.get(next(generator))
    except StopIteration:
        tracked.finish(emit, f"the Ray task for {label} ended without reporting this case")
        return False
    except ray.exceptions.RayError as exc:
        tracked.finish(emit, f"the Ray task for {label} failed: {failure_text(exc)}")
        return False
    if isinstance(result, Control | Ceiling) and isinstance(result.target, Target):  # its drift control, a ceiling
        emit(result)
        return True
    if isinstance(result, PlatformStatus) and _well_formed(result):  # a browser platform as the node's browser saw it
        emit(result)
        return True
    if (unknown := tracked.unknown(result)) is not None:
        ray.cancel(generator, force=True)
        tracked.finish(emit, f"the Ray task for {label} sent {unknown}; stopped, its other results are not trusted")
        return False
    tracked.reported.add(result.key)
    emit(tracked.checked(result))
    return True


def stream_jobs(ray: Any, jobs: list[Job], emit: Emit) -> None:
    """Start a streaming task per job and emit Results as they arrive from any of them, in this thread."""
    # max_retries=0: a job whose node or worker died is recorded as `error` rows, like a crashed local
    # worker; a silent retry would time the same cases again elsewhere and store some of them twice.
    task = ray.remote(num_returns="streaming", max_retries=0)(run_job_streaming)
    pending: dict[Any, _Tracked] = {}
    try:
        for job in jobs:
            wanted = demand(job)
            options = {"resources": {job.resource: 1}, "num_cpus": wanted["CPU"], "name": job.label}
            pending[task.options(**options).remote(job)] = _Tracked(job)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_S)
            for generator in ready:
                if not _take_next(ray, generator, pending[generator], emit):
                    del pending[generator]
    except BaseException:  # Ctrl-C or a store failure: stop the cluster's work for this run too
        for generator in pending:
            ray.cancel(generator, force=True)
        raise


def execute_on_ray(plan: SuitePlan, address: str) -> Body:
    """The suite as a body for harness.run.recording.record_run, run on the Ray cluster at address.

    Connects now, so a missing Ray or an unreachable cluster is an input error before any run is opened."""
    ray = connect(address)
    jobs = plan_jobs(plan)

    def body(emit: Emit) -> None:
        nodes, head = alive_nodes(ray), head_address(ray)
        runnable = []
        for job in jobs:
            if reason := infeasible(job, nodes, head):
                for row in _rows(job, job.expected(), "unsupported", reason):
                    emit(row)
            else:
                runnable.append(job)
        stream_jobs(ray, runnable, emit)

    return body


# --- --check ---------------------------------------------------------------------------------------


def custom_resources(node: dict[str, Any]) -> dict[str, float]:
    return {
        name: amount
        for name, amount in node["Resources"].items()
        if name not in RAY_OWN and not name.startswith(RAY_OWN_PREFIXES)
    }


def print_cluster_check(plan: SuitePlan, address: str, console: Console) -> None:
    """--check with --ray-address: the cluster's nodes, what hardware each offers, and what no node offers."""
    ray = connect(address)
    nodes = alive_nodes(ray)
    table = Table(title=f"Ray cluster at {address}: the hardware each node offers (custom resources)")
    for column in ("node", "host", "CPU", "hardware"):
        table.add_column(column, overflow="fold")
    for node in nodes:
        offered = ", ".join(f"{k}={v:g}" for k, v in sorted(custom_resources(node).items())) or "[red]none[/red]"
        host = f"{node.get('NodeManagerHostname', '?')} ({node.get('NodeManagerAddress', '?')})"
        table.add_row(node["NodeID"][:12], host, f"{node['Resources'].get('CPU', 0):g}", offered)
    console.print(table)
    head = head_address(ray)
    reasons = {job.resource: reason for job in plan_jobs(plan) if (reason := infeasible(job, nodes, head))}
    for resource, reason in reasons.items():
        console.print(f"[red]hardware '{resource}':[/red] {reason}; its jobs will be recorded as unsupported")
    if not reasons:
        console.print(f"every hardware of the plan is offered by a node of the {len(nodes)}-node cluster")
