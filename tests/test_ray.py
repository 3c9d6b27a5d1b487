"""Suites on Ray: a real two-node local cluster, each job placed by the custom resource named after its hardware."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'accelharness[ray]'")

from conftest import run_cli  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from test_native_run import rows  # noqa: E402
from test_suite import small_config  # noqa: E402

from harness.core.records import Result  # noqa: E402
from harness.run.plan import RequestError  # noqa: E402
from harness.run.recording import Body, Emit  # noqa: E402
from harness.suite.config import load_config  # noqa: E402
from harness.suite.plan import plan_suite  # noqa: E402
from harness.suite.ray import NativeJob, check_reachable, import_ray, plan_jobs, stream_jobs  # noqa: E402
from harness.suite.run import run_suite  # noqa: E402

STORE_MB = 80 * 1024 * 1024  # the smallest object store Ray accepts is plenty: a Result is a few KB


def write_config(directory: Path, name: str, hardware: list[str], engines: list[str], web: bool) -> Path:
    return small_config(directory, name, web, tuple(hardware), tuple(engines), {"embedding": ["bert-tiny"]})


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A head node that offers "cpu" and a second node that offers "wasm", one CPU slot each.

    The nodes are children of this process, so their workers inherit ACCELHARNESS_CACHE_DIR (conftest)."""
    head = {"num_cpus": 1, "resources": {"cpu": 1}, "object_store_memory": STORE_MB, "include_dashboard": False}
    local = Cluster(initialize_head=True, head_node_args=head)
    local.add_node(num_cpus=1, resources={"wasm": 1}, object_store_memory=STORE_MB)
    local.wait_for_nodes()
    ray.init(address=local.address, logging_level="WARNING")  # execute_on_ray uses this connection
    yield local
    ray.shutdown()
    local.shutdown()


def node_offering(resource: str) -> str:
    return next(n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"])


def details(row: dict) -> dict:
    return json.loads(row["details"]) if isinstance(row["details"], str) else row["details"]


def test_each_job_runs_on_the_node_offering_its_hardware(cluster: Cluster, tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, "two-nodes", ["cpu"], ["onnxruntime"], web=True))
    plan = plan_suite(config)
    assert [job.resource for job in plan_jobs(plan)] == ["cpu", "wasm"]
    summary = run_suite(plan, ray_address=cluster.address)
    assert summary.counts == {"ok": 2}
    stored = rows(config.db)
    assert {(r["hardware"], r["engine"]) for r in stored} == {("cpu", "onnxruntime"), ("wasm", "onnxruntime-web")}
    for row in stored:
        assert row["status"] == "ok", row["error"]
        node = details(row)["ray_node"]
        assert node["node_id"] and node["node_ip"] and node["hostname"]
        assert node["node_id"] == node_offering(row["hardware"])  # the wasm row ran on the wasm node
    assert rows(config.db, "SELECT suite_id, status FROM runs") == [{"suite_id": "two-nodes", "status": "completed"}]
    assert "ray_address" in json.loads(rows(config.db, "SELECT arguments FROM runs")[0]["arguments"])


def test_hardware_no_node_offers_is_unsupported_without_waiting(cluster: Cluster, tmp_path: Path) -> None:
    path = write_config(tmp_path, "missing", ["cpu", "openvino"], ["onnxruntime", "openvino"], web=False)
    config = load_config(path)
    started = time.monotonic()
    summary = run_suite(plan_suite(config), ray_address=cluster.address)
    assert time.monotonic() - started < 90  # Ray would queue an infeasible task forever
    by_hardware = {r["hardware"]: r for r in rows(config.db)}
    assert by_hardware["cpu"]["status"] == "ok", by_hardware["cpu"]["error"]
    assert by_hardware["openvino"]["status"] == "unsupported"
    assert "no Ray node offers resource 'openvino'" in by_hardware["openvino"]["error"]
    assert "--resources '{\"openvino\": 1}'" in by_hardware["openvino"]["error"]
    assert summary.counts == {"ok": 1, "unsupported": 1}
    checked = run_cli("suite", "--config", str(path), "--check", "--ray-address", cluster.address)
    assert checked.returncode == 0, checked.stderr
    assert "wasm=1" in checked.stdout and "cpu=1" in checked.stdout
    assert "hardware 'openvino'" in checked.stdout and "no Ray node offers" in checked.stdout


@dataclasses.dataclass(frozen=True)
class DyingJob(NativeJob):
    """Reports its first case, then its Ray worker process dies (as on a lost node or a killed worker)."""

    def body(self) -> Body:
        def body(emit: Emit) -> None:
            first = self.expected()[0][1]
            emit(Result(self.spec.name, self.spec.family, "random", self.target, first, "ok", samples_ms=[1.0]))
            time.sleep(1)  # the yielded Result reaches the driver before the process goes
            os._exit(3)

        return body


def test_a_task_that_dies_leaves_error_rows_for_the_cases_it_never_reported(cluster: Cluster, tmp_path: Path) -> None:
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the worker cannot import this test module
    config = load_config(write_config(tmp_path, "dying", ["cpu"], ["torch"], web=False))
    plan = plan_suite(config)
    plan.native.request.batch_sizes = [1, 2]
    (native,) = plan_jobs(plan)
    assert isinstance(native, NativeJob)
    emitted: list[Result] = []
    stream_jobs(ray, [DyingJob(native.plan, native.spec, native.target)], emitted.append)
    assert [(r.case.batch_size, r.status) for r in emitted] == [(1, "ok"), (2, "error")]
    assert emitted[0].details["ray_node"]["node_id"] == node_offering("cpu")
    assert "Ray task for bert-tiny cpu/torch failed" in (emitted[1].error or "")
    assert "died" in (emitted[1].error or "").lower()


@dataclasses.dataclass(frozen=True)
class LyingJob(NativeJob):
    """Streams results that break Result's invariants, as a node running other code could: a NaN
    sample, an unknown status, an `ok` without samples; then an object that is not a Result at all.
    They are altered after construction, since unpickling on the driver skips __post_init__ too."""

    def body(self) -> Body:
        def body(emit: Emit) -> None:
            cases = [case for _, case in self.expected()]
            made = [Result(self.spec.name, self.spec.family, "random", self.target, c, "ok", samples_ms=[1.0])
                    for c in cases]  # fmt: skip
            made[0].samples_ms = [1.0, float("nan")]
            made[1].status = "great"
            made[2].samples_ms = []
            for result in made[:3]:
                emit(result)
            emit(types.SimpleNamespace(status="ok", samples_ms=[1.0], details={}))  # type: ignore[arg-type]
            time.sleep(60)  # the driver stops the task once it has seen the stranger

        return body


def test_results_from_nodes_are_validated_again_on_the_driver(cluster: Cluster, tmp_path: Path) -> None:
    """Each broken result becomes an `error` row for its case saying why; the task that sent a
    non-Result is stopped and its remaining case recorded (issue 11, item 11)."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the worker cannot import this test module
    config = load_config(write_config(tmp_path, "lying", ["cpu"], ["torch"], web=False))
    plan = plan_suite(config)
    plan.native.request.batch_sizes = [1, 2, 3, 4]
    (native,) = plan_jobs(plan)
    emitted: list[Result] = []
    started = time.monotonic()
    stream_jobs(ray, [LyingJob(native.plan, native.spec, native.target)], emitted.append)
    assert time.monotonic() - started < 50  # stopped at the dict, not after the task's minute
    assert [(r.case.batch_size, r.status) for r in emitted] == [(1, "error"), (2, "error"), (3, "error"), (4, "error")]
    for row in emitted:
        row.validate()  # what reaches the store holds every invariant
    nan, great, empty, stranger = (r.error or "" for r in emitted)
    assert "failed validation on the driver: samples_ms must hold finite numbers > 0 (1 do not, e.g. nan)" in nan
    assert "status 'great' is not one of ok, unsupported" in great
    assert "status 'ok' needs latency samples" in empty
    assert "sent a SimpleNamespace, not a Result; stopped, its other results are not trusted" in stranger
    assert emitted[0].details["ray_node"]["node_id"] == node_offering("cpu")
    assert emitted[0].samples_ms == [] and emitted[0].weights == "unknown"  # nothing of the broken result is kept


def test_missing_ray_and_an_unreachable_cluster_are_input_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patched:
        patched.setitem(sys.modules, "ray", None)  # as if the extra were not installed
        with pytest.raises(RequestError, match=r"install the ray extra: pip install 'accelharness\[ray\]'"):
            import_ray()
    with pytest.raises(RequestError, match="no Ray cluster answers there"):
        check_reachable("127.0.0.1:1")  # at once, where ray.init would retry for minutes
