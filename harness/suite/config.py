"""The suite config file (TOML or JSON): strict keys, typed values, errors that name file, key and valid values.

The keys follow the older system's suite config (batch_sizes, warmup_iterations, model_families,
hardware_types, include_web_platforms, parallel, generate_plots, update_compatibility_matrix) so a
converted file reads the same; a key this file does not know is an error, never silently ignored.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, get_args, get_type_hints

from harness.browser.run import ALL_BROWSERS, WEB_MODES, WebRequest
from harness.core.options import Opt, declared, problem
from harness.core.records import MODES, PRECISIONS
from harness.native import DEFAULT_ENGINES, ENGINES
from harness.prepare.specs import FAMILIES, load_specs
from harness.run.hardware import NATIVE_PLATFORMS
from harness.run.machine import check_machine_label
from harness.run.plan import BenchmarkRequest, RequestError, RunOptions, check_context
from harness.web.eps import WEB_HARDWARE
from harness.web.runtimes import OWN_RUNTIME, PAGE_RUNTIMES

DEFAULT_CONFIG = f"""\
# accelharness suite config. Run: accelharness suite --config THIS_FILE [--check] [--resume]
# Every key is optional; an unknown key is an error.

# The suite's id: --resume continues this suite's last unfinished run, --older-than re-runs its stale results.
name = "default"

batch_sizes = [1, 4]
sequence_lengths = [32]          # text inputs only
warmup_iterations = 5            # untimed runs after the first run
benchmark_iterations = 20        # minimum timed iterations ...
min_duration_s = 0.5             # ... and minimum seconds of them
max_time_s = 10                  # seconds of warmup + timed iterations per case (0: no budget) ...
min_iterations = 3               # ... never stopping the timed loop below this many
timeout = 600                    # seconds a worker or page may take per case
prepare_timeout = 3600           # seconds a model's preparation may take (cold exports), apart from timeout
precision = ["fp32"]             # {", ".join(PRECISIONS)}
profile = false                  # per-operator profiles after each inference case's timed loop
modes = ["inference"]            # {", ".join(MODES)} (the browser: {", ".join(WEB_MODES)}); as --mode
# new_tokens = {RunOptions.new_tokens}          # with "generate" in modes: tokens generated per sequence (--new-tokens)
# depths = [0, 512]              # with "generate" in modes: KV-cache depths filled before each generation (--depths)
# prompt = "The capital of France is"  # with "generate": the prompt's text (--prompt; chat = true: --chat)
# prompt_ids = [1, 2, 3]         # with "generate": the prompt as token ids (--prompt-ids)
# stop_at_eos = true             # with "generate": stop at the model's EOS id (--stop-at-eos; default: EOS ignored)
# no_ceilings = true             # measure no target's bandwidth and compute ceilings (--no-ceilings)
# ceilings = "fresh"             # measure them again rather than reuse this machine's of the last day (--ceilings)

# family -> models (`accelharness models` lists them; the -tiny variants build in seconds)
[model_families]
embedding = ["bert-tiny"]
text_generation = ["gpt2-tiny"]
vision = ["vit-tiny"]
audio = ["wav2vec2-tiny"]
multimodal = ["clip-tiny"]

[hardware]
hardware_types = ["cpu", "openvino"]   # native: {", ".join(NATIVE_PLATFORMS)}
engines = []                           # {", ".join(ENGINES)}; empty = {", ".join(DEFAULT_ENGINES)}
include_web_platforms = true
web_platforms = ["wasm"]               # {", ".join(WEB_HARDWARE)}
web_threads = [1]
# web_runtimes = ["onnxruntime-web", "transformers.js", "llama.cpp"]   # page runtimes: {", ".join(PAGE_RUNTIMES)}
# native_threads = [1, 2]              # native intra-op threads, a target per count (default: each engine's own)
browsers = ["chromium"]                # {", ".join(ALL_BROWSERS)}: each a target (firefox, safari: launched)
gpu = "auto"                           # browser: on (real WebGPU), off (software), auto (on with a GPU)

[run]
parallel = true                        # one worker per independent device (CPU work never overlaps)
generate_plots = true                  # the self-contained HTML report
update_compatibility_matrix = true
db = "accelharness.duckdb"
output_dir = "accelharness-results"
"""


class ConfigError(RequestError):
    """A malformed suite config: the message names the file, the key and what is valid."""


@dataclass
class SuiteConfig:
    """A checked suite config; keys the file leaves out take DEFAULT_CONFIG's values."""

    name: str
    batch_sizes: list[int]
    sequence_lengths: list[int]
    warmup_iterations: int
    benchmark_iterations: int
    min_duration_s: float
    max_time_s: float
    min_iterations: int
    timeout: float
    prepare_timeout: float
    precision: list[str]
    profile: bool
    modes: list[str]
    model_families: dict[str, list[str]]
    hardware_types: list[str]
    engines: list[str]
    include_web_platforms: bool
    web_platforms: list[str]
    web_threads: list[int]
    browsers: list[str]
    gpu: str
    parallel: bool
    generate_plots: bool
    update_compatibility_matrix: bool
    db: Path
    output_dir: Path
    new_tokens: int = RunOptions.new_tokens  # generate: tokens generated per sequence (the key only with generate)
    depths: list[int] = field(default_factory=lambda: [0])  # generate: KV-cache depths (the key only with generate)
    machine_label: str | None = None  # names this machine in reports across machines
    native_threads: list[int] | None = None  # --native-threads: None, each engine's own count
    prompt: str | None = None  # generate: the prompt's text (--prompt), tokenized with each model's tokenizer.json
    chat: bool = False  # --chat: the prompt as one user message of each model's chat template
    prompt_ids: list[int] | None = None  # --prompt-ids: the prompt as token ids
    stop_at_eos: bool = False  # --stop-at-eos: generations stop at the model's EOS id
    no_ceilings: bool = False  # --no-ceilings: no target's ceilings measured
    ceilings: str = RunOptions.ceilings  # --ceilings: reuse a target's ceilings of the last day here, or fresh
    web_runtimes: list[str] = field(default_factory=lambda: [OWN_RUNTIME])  # page runtimes, each a target
    source: Path | None = None  # the file it came from, for messages

    @property
    def models(self) -> list[str]:
        return [model for names in self.model_families.values() for model in names]


SECTIONS = {"hardware", "run"}  # TOML tables that only group keys; JSON may use them or stay flat
# The keys that are run options: each is its request field's option (harness.core.options: bound, choices,
# duration) under the seed's key name (Opt.key, where it differs from the field's), checked as its flag is.
OPTION_FIELDS: dict[type, tuple[str, ...]] = {
    RunOptions: ("batch_sizes", "sequence_lengths", "warmup", "iterations", "min_duration_s", "max_time_s",
                 "min_iterations", "timeout_s", "prepare_timeout_s", "precision", "profile", "modes", "new_tokens",
                 "depths", "prompt", "chat", "prompt_ids", "stop_at_eos", "no_ceilings", "ceilings", "db_path",
                 "output_dir", "machine_label"),
    BenchmarkRequest: ("hardware", "engines", "native_threads"),
    WebRequest: ("hardware", "runtimes", "browsers", "threads", "gpu"),
}  # fmt: skip


def _option_keys() -> dict[str, tuple[Opt, type]]:
    """Each option key's Opt and the type its value takes in the file (a list for a comma-separated flag)."""
    keys: dict[str, tuple[Opt, type]] = {}
    for request, names in OPTION_FIELDS.items():
        hints, declared_here = get_type_hints(request), declared(request)
        for name in names:
            opt = declared_here[name]
            if opt.zero_is_none:  # the file keeps 0 (no budget) where the command line's 0 becomes None
                opt = replace(opt, seconds=(False, opt.seconds[1] if opt.seconds else math.inf))
            kinds = [k for k in get_args(hints[name]) or (hints[name],) if k is not type(None)]
            kind = list if opt.many else str if kinds[0] is Path else kinds[0]
            keys[opt.key or name] = (opt, kind)
    return keys


OPTION_KEYS = _option_keys()
KEY_TYPES: dict[str, type] = {  # the suite's own keys, then the run options'
    "name": str,
    "model_families": dict,
    "include_web_platforms": bool,
    "parallel": bool,
    "generate_plots": bool,
    "update_compatibility_matrix": bool,
} | {key: kind for key, (_, kind) in OPTION_KEYS.items()}


def _parse(path: Path) -> dict[str, Any]:
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read suite config {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}): "
            "a suite config is a TOML or JSON text file"
        ) from exc
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys(path)) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError, RecursionError) as exc:
        kind = "JSON" if path.suffix == ".json" else "TOML (use a .json name for JSON)"
        raise ConfigError(f"{path} is not valid {kind}: {exc}") from exc
    return _flatten(path, data)


def _unique_keys(path: Path) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """json.loads keeps the last of two equal keys; TOML refuses them, and so does this."""

    def build(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        built: dict[str, Any] = {}
        for key, value in pairs:
            if key in built:
                raise ConfigError(f"{path}: key '{key}' is set twice in one object; keep one")
            built[key] = value
        return built

    return build


def _flatten(path: Path, data: Any) -> dict[str, Any]:
    """The sections' keys lifted to the top level; a key set in two places is refused, naming both."""
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a table/object of keys, got {type(data).__name__}")
    flat: dict[str, Any] = {}
    where: dict[str, str] = {}
    for section, table in data.items():
        lifted = table if section in SECTIONS and isinstance(table, dict) else {section: table}
        place = f"in [{section}]" if lifted is table else "at the top level"
        for key, value in lifted.items():
            if key in flat:
                raise ConfigError(f"{path}: key '{key}' is set twice, {where[key]} and {place}; keep one")
            flat[key], where[key] = value, place
    return flat


def _check_type(path: Path, key: str, value: Any) -> Any:
    expected = KEY_TYPES[key]
    # bool is an int in Python; a config's `true` is never a count
    ok = isinstance(value, expected) and not (expected in (int, float) and isinstance(value, bool))
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        ok, value = True, float(value)
    if not ok:
        raise ConfigError(f"{path}: key '{key}' must be {expected.__name__}, got {type(value).__name__} {value!r}")
    if key not in OPTION_KEYS:
        return value
    opt = OPTION_KEYS[key][0]
    if opt.many:  # a list of counts (a bounded option) or of names
        item_type = int if opt.low is not None else str
        for item in value:
            if not isinstance(item, item_type) or isinstance(item, bool):
                raise ConfigError(f"{path}: key '{key}' takes a list of {item_type.__name__}, got {item!r}")
    if found := problem(f"key '{key}'", opt, value, noun="value", empty_ok=True):
        raise ConfigError(f"{path}: {found}")
    return value


def _check_families(path: Path, families: dict[str, Any]) -> dict[str, list[str]]:
    specs = load_specs()
    for family, names in families.items():
        if family in KEY_TYPES:  # TOML: a key written below the [model_families] header belongs to it
            raise ConfigError(
                f"{path}: [model_families] holds '{family}', a top-level key, not a family (in TOML every key "
                "below a [table] header belongs to that table): move it above the [model_families] header"
            )
        if family not in FAMILIES:
            raise ConfigError(f"{path}: model_families: unknown family '{family}'; valid: {', '.join(FAMILIES)}")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"{path}: model_families.{family} must be a list of model names, got {names!r}")
        for name in names:
            if name not in specs:
                raise ConfigError(
                    f"{path}: model_families.{family}: unknown model '{name}'; valid: "
                    + ", ".join(sorted(n for n, s in specs.items() if s.family == family))
                )
            if specs[name].family != family:
                raise ConfigError(
                    f"{path}: model_families.{family}: '{name}' belongs to family {specs[name].family}, not {family}"
                )
    return families


def default_values() -> dict[str, Any]:
    """Each key's value when a file leaves it out: DEFAULT_CONFIG's, else SuiteConfig's default."""
    defaults = {f.name: f.default for f in fields(SuiteConfig) if f.default is not MISSING and f.name != "source"}
    return defaults | _flatten(Path("DEFAULT_CONFIG"), tomllib.loads(DEFAULT_CONFIG))


def load_config(path: Path) -> SuiteConfig:
    """Parse and check a suite config; raise ConfigError naming the file, the key and the valid values."""
    data = _parse(path)
    valid = [f.name for f in fields(SuiteConfig) if f.name != "source"]
    values = default_values()
    for key, value in data.items():
        if key in FAMILIES:
            raise ConfigError(f"{path}: '{key}' is a model family: list its models under [model_families]")
        if key not in KEY_TYPES:
            raise ConfigError(f"{path}: unknown key '{key}'; valid keys: {', '.join(valid)}")
        values[key] = _check_type(path, key, value)
    if "model_families" in values:
        values["model_families"] = _check_families(path, values["model_families"])
    for key in ("db", "output_dir"):
        values[key] = Path(values[key])
    try:
        check_machine_label(values.get("machine_label"), f"{path}: key 'machine_label'")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    config = SuiteConfig(**values, source=path)
    if not config.models:
        raise ConfigError(f'{path}: model_families names no model; e.g. embedding = ["bert-tiny"]')
    _check_platforms(path, config)
    _check_modes(path, config, [key for key in GENERATE_KEYS if key in data])
    return config


# the keys a config may give only with "generate" in modes (each would do nothing without it)
GENERATE_KEYS = ("new_tokens", "depths", "prompt", "chat", "prompt_ids", "stop_at_eos")


def _check_modes(path: Path, config: SuiteConfig, generate_keys: list[str]) -> None:
    """modes and new_tokens as --mode and --new-tokens are checked: a mode each half can run, new_tokens
    only with generate (it would do nothing), and each prompt plus its new tokens within every model's context."""
    if not config.modes:
        raise ConfigError(f"{path}: key 'modes' is empty; valid: {', '.join(MODES)}")
    config.modes = list(dict.fromkeys(config.modes))
    if generate_keys and "generate" not in config.modes:
        named = " and ".join(f"'{key}'" for key in generate_keys)
        verb = "applies" if len(generate_keys) == 1 else "apply"
        raise ConfigError(
            f"{path}: key{'s' if len(generate_keys) > 1 else ''} {named} {verb} to generate only "
            f'(modes = {config.modes}); add "generate" to modes or drop {"it" if len(generate_keys) == 1 else "them"}'
        )
    if config.include_web_platforms and not set(config.modes) & set(WEB_MODES):
        raise ConfigError(
            f"{path}: modes = {config.modes} with include_web_platforms = true: the browser runs "
            f"{', '.join(WEB_MODES)}; add one of them or set include_web_platforms = false"
        )
    if "generate" in config.modes:
        specs = load_specs()
        try:
            check_context([specs[m] for m in config.models], config.sequence_lengths, config.new_tokens,
                          ("key 'sequence_lengths'", "key 'new_tokens'", "key 'depths'"), config.depths)  # fmt: skip
        except RequestError as exc:
            raise ConfigError(f"{path}: {exc}") from None


def _check_platforms(path: Path, config: SuiteConfig) -> None:
    """The config runs something, and each half it turns on has platforms to run on."""
    if config.include_web_platforms and not config.web_platforms:
        raise ConfigError(
            f"{path}: include_web_platforms = true with web_platforms = []: list the browser EPs to run "
            f"({', '.join(WEB_HARDWARE)}), or set include_web_platforms = false"
        )
    if not config.hardware_types and not config.include_web_platforms:
        raise ConfigError(
            f"{path}: hardware_types = [] and include_web_platforms = false: the config runs nothing; list native "
            f"platforms in hardware_types ({', '.join(NATIVE_PLATFORMS)}) or set include_web_platforms = true"
        )


def write_default_config(path: Path) -> None:
    if path.exists():
        raise ConfigError(f"{path} exists; choose another path or remove it first")
    path.write_text(DEFAULT_CONFIG)
