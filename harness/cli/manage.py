"""Commands about the machine and the store itself: hardware, models, db init."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from harness.analysis.options import DbInit, Models
from harness.cli.common import console, fail, shown, with_options
from harness.store import StoreError, init_store


def hardware_command() -> None:
    """List every platform with available yes/no and the reason, plus CPU, memory and GPUs, and the
    devices the engines' own discovery reports (ONNX Runtime's EP devices, plugin EPs registered)."""
    from harness.run.hardware import detect_platforms, machine_probe
    from harness.run.provenance import host_facts

    host = host_facts()
    console.print(
        f"CPU: {host['cpu_model']} — {host['cpu_physical_cores']} cores / {host['cpu_cores']} threads; "
        f"memory {host['memory_gb']} GB"
    )
    gpus = set(machine_probe().gpu_names or [])  # every engine probed: torch among them names the GPUs
    console.print(f"GPUs: {shown(', '.join(sorted(gpus))) or 'none detected'}")
    table = Table()
    for name in ("platform", "available", "reason"):
        table.add_column(name, overflow="fold")
    for status in detect_platforms():
        table.add_row(status.platform, "yes" if status.available else "no", shown(status.reason))
    console.print(table)
    for engine, devices in machine_probe().discovered.items():
        console.print(discovered_table(engine, devices))


def discovered_table(engine: str, devices: list[dict]) -> Table:
    """An engine's discovered devices: EP, device type, vendor, ids, metadata (text from a driver: shown())."""
    table = Table(title=f"{engine}: devices its own discovery reports (onnxruntime.get_ep_devices)")
    for name in ("EP", "type", "vendor", "vendor id", "device id", "metadata"):
        table.add_column(name, overflow="fold")
    for d in devices:
        if "not_registered" in d:
            table.add_row(shown(d["ep"]), "—", "—", "—", "—", shown(d["not_registered"]))
            continue
        metadata = "; ".join(f"{k}={v}" for k, v in {**d["ep_metadata"], **d["device_metadata"]}.items())
        row = (d["ep"], d["type"], d["vendor"], f"0x{d['vendor_id']:04x}", str(d["device_id"]), metadata)
        table.add_row(*(shown(v) for v in row))
    return table


ENGINE_STATUS_SQL = """
WITH latest AS (
    SELECT model, engine, results.status,
           dense_rank() OVER (PARTITION BY model, engine ORDER BY started_at DESC, run_id DESC) AS k
    FROM results JOIN runs USING (run_id))
SELECT model, engine, status, count(*) AS n FROM latest WHERE k = 1 GROUP BY ALL ORDER BY model, engine, status
"""


def engine_statuses(db: Path) -> dict[str, str]:
    """model → "engine: status×count …" from each engine's latest run of it; empty without a DB."""
    from harness.store import open_store

    if not db.exists():
        return {}
    with open_store(db, read_only=True) as store:
        rows = store.query(ENGINE_STATUS_SQL)
    cells: dict[str, dict[str, list[str]]] = {}
    for r in rows:
        cells.setdefault(r["model"], {}).setdefault(r["engine"], []).append(f"{r['status']}×{r['n']}")
    return {m: "; ".join(f"{e}: {' '.join(s)}" for e, s in by_engine.items()) for m, by_engine in cells.items()}


@with_options(Models)
def models(*, db_path: Path) -> None:
    """List the model specs: family, variant, architecture, inputs, parameters (counted on the meta
    device, nothing allocated) and, from --db if it exists, each engine's statuses in its latest run."""
    from harness.prepare.specs import load_specs
    from harness.prepare.workload import count_parameters

    try:
        statuses = engine_statuses(db_path)
    except StoreError as exc:
        raise fail(str(exc)) from None
    table = Table()
    for name in ("model", "family", "variant", "architecture", "inputs", "parameters"):
        table.add_column(name, no_wrap=True)
    table.add_column(f"engines ({db_path.name})", overflow="fold")
    for spec in sorted(load_specs().values(), key=lambda s: (s.family, s.name)):
        try:
            parameters = f"{count_parameters(spec):,}"
        except Exception as exc:  # a spec transformers cannot build: say so, list the rest
            parameters = f"cannot build: {exc}"[:80]
        row = (spec.name, spec.family, spec.variant, spec.architecture, spec.inputs.kind, parameters)
        table.add_row(*row, shown(statuses.get(spec.name, "—")))  # statuses: stored text
    console.print(table)


@with_options(DbInit)
def db_init(*, db_path: Path, overwrite: bool) -> None:
    """Create the schema (idempotent)."""
    try:
        init_store(db_path, overwrite)
    except StoreError as exc:
        raise fail(str(exc)) from None
    console.print(f"schema ready in {shown(db_path)}")
