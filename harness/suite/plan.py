"""A suite's plan: its config → the native and browser requests it stands for, validated; the
device groups that may run side by side; and --check's prerequisites.

A suite has an id (its config's `name`). --resume continues the suite's last run if it did not
complete (Ctrl-C leaves it 'interrupted', kill -9 leaves it 'running') and was started with the same
config, running only the result keys it does not hold; --older-than re-runs only the keys the
suite has not measured recently.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from harness.browser.run import WEB_MODES, WebPlan, WebRequest, validate_web
from harness.core.paths import unwritable_directory
from harness.core.records import Target
from harness.core.threads import split_threads
from harness.native import get_backend
from harness.prepare.cache import cache_root
from harness.prepare.specs import FAMILIES, load_specs
from harness.run.plan import BenchmarkRequest, Plan, RequestError, validate
from harness.store import StoreError, as_stored, open_store
from harness.suite.config import SuiteConfig, default_values
from harness.web.eps import WEB_HARDWARE

HOST = "host-cpu"
WEB_TARGET_HARDWARE = set(WEB_HARDWARE)
LOW_DISK_GB = 2.0


def device_group(target: Target) -> str:
    """Targets in one group share compute and run one after another; different groups run side by side.

    Everything that computes on the host's cores (torch and ORT on CPU, OpenVINO CPU, and headless
    Chromium, whose WebGPU is SwiftShader on those same cores) is one group, so no CPU timing is
    polluted by another job; a CUDA device, an NPU or an OpenVINO GPU is its own group (the engine
    says which device a target computes on: Backend.device)."""
    if target.hardware in WEB_TARGET_HARDWARE:
        return HOST
    return get_backend(target.engine).device(split_threads(target)[0]) or HOST  # the provider as the engine knows it


@dataclass
class SuitePlan:
    config: SuiteConfig
    native: Plan | None
    web: WebPlan | None
    resume_run_id: str | None  # the unfinished run --resume continues; None: a new run
    resume_note: str = ""  # with --resume: the run it continues, or why it starts a new one

    @property
    def total_results(self) -> int:
        return sum(p.total_results for p in (self.native, self.web) if p is not None)

    def results_by_mode(self) -> dict[str, int]:
        """Mode → the results still to run in it (both halves): what --check shows of each mode."""
        counts: dict[str, int] = {}
        native = self.native
        for spec, target in [(s, t) for s in native.specs for t, _ in native.targets] if native else []:
            for case in native.remaining(spec, target):
                counts[case.mode] = counts.get(case.mode, 0) + 1
        web = self.web
        for spec, setting in [(s, e) for s in web.specs for e in web.settings] if web else []:
            for case in web.remaining(spec, setting):
                counts[case.mode] = counts.get(case.mode, 0) + 1
        return counts

    def groups(self) -> dict[str, list[Target]]:
        """Device group → its targets, in plan order (one group when the config says parallel = false)."""
        grouped: dict[str, list[Target]] = {}
        targets = [t for t, _ in self.native.targets] if self.native else []
        targets += [s.target for s in self.web.settings] if self.web else []
        for target in targets:
            grouped.setdefault(device_group(target) if self.config.parallel else HOST, []).append(target)
        return grouped


def _selected_models(config: SuiteConfig, models: list[str] | None) -> list[str]:
    """--models filter: each entry a family (its models in the config) or a model name."""
    if not models:
        return config.models
    specs = load_specs()
    chosen: list[str] = []
    for entry in models:
        if entry in FAMILIES:
            chosen += config.model_families.get(entry, [])
        elif entry in specs:
            chosen.append(entry)
        else:
            raise RequestError(f"--models: '{entry}' is neither a family ({', '.join(FAMILIES)}) nor a model name")
    if not chosen:
        raise RequestError(f"--models {','.join(models)} selects no model of the config's {config.models}")
    return list(dict.fromkeys(chosen))


def suite_requests(
    config: SuiteConfig, models: list[str] | None = None, hardware: list[str] | None = None
) -> tuple[BenchmarkRequest | None, WebRequest | None]:
    """The native and browser requests a config (narrowed by --models / --hardware) stands for."""
    names = _selected_models(config, models)
    native_hw = [h for h in config.hardware_types if hardware is None or h in hardware]
    web_hw = [h for h in config.web_platforms if config.include_web_platforms and (hardware is None or h in hardware)]
    unknown = [h for h in hardware or [] if h not in config.hardware_types and h not in config.web_platforms]
    if unknown:
        raise RequestError(
            f"--hardware: '{unknown[0]}' is not in the config's hardware_types {config.hardware_types} "
            f"or web_platforms {config.web_platforms}"
        )
    web_modes = [m for m in config.modes if m in WEB_MODES]  # training runs natively only (the config says so)
    shared = dict(
        models=names,
        batch_sizes=config.batch_sizes,
        sequence_lengths=config.sequence_lengths,
        warmup=config.warmup_iterations,
        iterations=config.benchmark_iterations,
        min_duration_s=config.min_duration_s,
        max_time_s=config.max_time_s or None,  # 0: no budget
        min_iterations=config.min_iterations,
        timeout_s=config.timeout,
        prepare_timeout_s=config.prepare_timeout,
        profile=config.profile,
        modes=config.modes,
        new_tokens=config.new_tokens,
        depths=config.depths,
        prompt=config.prompt,
        chat=config.chat,
        prompt_ids=config.prompt_ids,
        stop_at_eos=config.stop_at_eos,
        no_ceilings=config.no_ceilings,
        ceilings=config.ceilings,
        db_path=config.db,
        output_dir=None,  # the suite writes its reports once, after both halves
    )
    native = (
        BenchmarkRequest(
            **shared,
            hardware=native_hw,
            engines=config.engines or None,
            precision=config.precision,
            native_threads=config.native_threads,
        )
        if native_hw
        else None
    )
    web = (
        WebRequest(
            **shared | {"modes": web_modes},
            hardware=web_hw,
            runtimes=config.web_runtimes,
            browsers=config.browsers,
            threads=config.web_threads,
            gpu=config.gpu,
        )
        if web_hw
        else None
    )
    if native is None and web is None:
        raise RequestError(f"--hardware {','.join(hardware or [])} leaves nothing to run")
    return native, web


def _done_keys(
    config: SuiteConfig, resume: bool, older_than: timedelta | None
) -> tuple[frozenset[str], str | None, str]:
    """The keys to skip, the run to continue (--resume), and what --resume decided — read from the
    store before anything is written."""
    if not (resume or older_than):
        return frozenset(), None, ""
    if not Path(config.db).exists():
        return frozenset(), None, f"no database at {config.db} yet; starting a new run"
    with open_store(Path(config.db), read_only=True) as store:
        if older_than is not None:
            since = datetime.now(UTC).replace(tzinfo=None) - older_than
            return frozenset(store.fresh_keys(config.name, since)), None, ""
        unfinished = store.unfinished_run(config.name)
        if unfinished is None:
            return frozenset(), None, f"suite '{config.name}' has no unfinished run in {config.db}; starting a new run"
        run_id, arguments = unfinished
        if changes := config_changes(arguments.get("config", {}), config):
            why = f"run {run_id} was started with another config ({'; '.join(changes)}); starting a new run"
            return frozenset(), None, why
        return frozenset(store.result_keys(run_id)), run_id, f"continuing run {run_id}"


def config_changes(stored: dict[str, Any], config: SuiteConfig) -> list[str]:
    """How `config` differs from the config a run stored ("key: then → now"); where the file lies
    (`source`) is not part of it. A key the run's version did not have (e.g. modes) ran as its
    default does, so it differs only when the config sets it to something else."""
    now = as_stored(dataclasses.asdict(config))
    then = as_stored(default_values()) | stored
    keys = [k for k in now if k != "source" and then.get(k) != now[k]]
    return [f"{key}: {then.get(key)} → {now[key]}" for key in keys]


def plan_suite(
    config: SuiteConfig,
    models: list[str] | None = None,
    hardware: list[str] | None = None,
    resume: bool = False,
    older_than: timedelta | None = None,
) -> SuitePlan:
    """Validate everything (both halves, the store) before anything is written."""
    if resume and older_than is not None:
        raise RequestError("--resume continues an unfinished run; --older-than starts a new one: pass one of them")
    native_request, web_request = suite_requests(config, models, hardware)
    try:
        native = validate(native_request) if native_request else None
        web = validate_web(web_request) if web_request else None
        if why := unwritable_directory(Path(config.output_dir)):
            raise RequestError(f"output_dir {config.output_dir}: {why}; nothing was run")
    except RequestError as exc:
        raise RequestError(f"{config.source or 'suite config'}: {exc}") from exc
    done, resume_run_id, resume_note = _done_keys(config, resume, older_than)
    if native is not None:
        native.done = done
    if web is not None:
        web.done = done
    return SuitePlan(config, native, web, resume_run_id, resume_note)


@dataclass(frozen=True)
class Check:
    item: str
    ok: bool
    detail: str


def check_prerequisites(plan: SuitePlan) -> list[Check]:
    """What --check verifies before a long run: engines and devices, browser, disk, the store."""
    checks = []
    for target, availability in plan.native.targets if plan.native else []:
        checks.append(Check(f"engine {target.label}", availability.ok, availability.reason))
    if plan.web is not None:
        browser = plan.web.browser
        if browser is not None:
            fallback = f" ({browser.fallback})" if browser.fallback else ""
            checks.append(Check("browser", True, f"{browser.kind}: {browser.binary}{fallback}"))
        for launched in plan.web.launched:
            checks.append(Check("browser", True, f"{launched.kind}: {launched.binary} ({launched.version})"))
    for label, path in (("disk (output dir)", plan.config.output_dir), ("disk (export cache)", cache_root())):
        existing = next(p for p in [Path(path).absolute(), *Path(path).absolute().parents] if p.exists())
        free_gb = shutil.disk_usage(existing).free / 2**30
        checks.append(Check(label, free_gb >= LOW_DISK_GB, f"{free_gb:.1f} GB free at {existing}"))
    checks.append(_store_check(plan))
    return checks


def _store_check(plan: SuitePlan) -> Check:
    db = Path(plan.config.db)
    if not db.exists():
        return Check("store", True, f"{db} will be created")
    try:
        with open_store(db, read_only=True) as store:
            runs = store.query("SELECT count(*) AS n FROM runs")[0]["n"]
    except StoreError as exc:
        return Check("store", False, str(exc))
    resume = f"; --resume continues run {plan.resume_run_id}" if plan.resume_run_id else ""
    return Check("store", True, f"{db}: {runs} runs, writable{resume}")
