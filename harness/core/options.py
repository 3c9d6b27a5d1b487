"""One definition per option: a request dataclass's field carries its flag, help, bound and choices, and
everything that takes the option is built from it and checked by `check()` (the command line's flags, the
suite config's keys, the Python API's dataclass). optimum-benchmark's one config tree is the model.

    warmup: int = option(5, flag="--warmup", key="warmup_iterations", low=0, high=MAX_ITERATIONS, help="…")

Adding an option is one field: its flag appears on every command built from the dataclass (harness.cli.common
generates their signatures), its key in the suite config, and its check runs wherever the request is checked.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from typing import Any

from harness.core.bounds import out_of_range

OPTION = "option"  # the key of a field's metadata that holds its Opt
# The longest duration (--timeout, --max-time): beyond it a case is a hang, and asyncio/JS timers stop being exact.
MAX_TIMEOUT_S = 7 * 24 * 3600.0
# The helps of options that commands outside the run options take too (predict's --model-path, the reports' --db).
DB_HELP = "DuckDB file."
OUTPUT_DIR_HELP = "Where the reports and the matrix go."
MODEL_PATH_HELP = "A local HF model directory or an .onnx file."


class RequestError(ValueError):
    """Invalid user input: the message names what was wrong and what is valid."""


@dataclass(frozen=True)
class Opt:
    """What one option is, wherever it is given. A count has low..high; a duration `seconds` = (positive,
    limit); a closed set of values `choices` (named `noun` in the command line's message)."""

    flag: str  # the command line's spelling
    help: str
    key: str | None = None  # the suite config's key, where the seed's name differs from the field's
    many: bool = False  # comma-separated on the command line, a list in the suite config
    low: int | None = None
    high: int | None = None
    seconds: tuple[bool, float] | None = None  # (must be > 0, the longest)
    choices: tuple[str, ...] | None = None
    noun: str = "value"
    zero_is_none: bool = False  # the command line's 0 means None (--max-time 0: no budget)
    repeat: bool = False  # a list given as the flag once per value (--browser-arg X --browser-arg Y)
    # a many-valued option whose items form values of their own (--precision encoder=fp32,decoder=q4): its one
    # parse, raising ValueError with what is valid; checked in place of `choices`, which then name the plain values
    parse: Callable[[list[str]], Any] | None = None

    def prefixed(self, prefix: str | None) -> Opt:
        """The option in a command that has a native and a browser half, where the browser's name would
        collide with the native one (`run`, `ab`: --web-hardware is WebRequest's --hardware)."""
        return self if prefix is None else replace(self, flag=f"--{prefix}-{self.flag.removeprefix('--')}")


def option(default: Any = MISSING, *, factory: Any = MISSING, **declared: Any) -> Any:
    """A dataclass field that is an option (`declared` are Opt's fields)."""
    return field(default=default, default_factory=factory, metadata={OPTION: Opt(**declared)})


def reuse(request: Any, name: str, *, prefix: str | None = None, **default: Any) -> Any:
    """A field of another request declared by `request`'s field `name`: the same option (flag, help, bound,
    choices; its flag `prefixed`), with this request's own default (`default=` or `factory=`)."""
    opt = declared(request)[name].prefixed(prefix)
    return field(default=default.get("default", MISSING), default_factory=default.get("factory", MISSING),
                 metadata={OPTION: opt})  # fmt: skip


def declared(cls: Any) -> dict[str, Opt]:
    """The options a request dataclass declares, by field name, in field order."""
    return {f.name: f.metadata[OPTION] for f in fields(cls) if OPTION in f.metadata}


def default_of(f: Field) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


def items(value: Any) -> list[Any]:
    """A many-valued option's values: a list, or a comma-separated string (the API accepts both)."""
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return list(value)


def problem(name: str, opt: Opt, value: Any, noun: str | None = None, empty_ok: bool = False) -> str | None:
    """What is wrong with one option's value (`name`: its flag or config key), or None. The suite config names
    a wrong choice a `noun` "value" and takes empty lists (`empty_ok`: hardware_types = [] runs no native half)."""
    if value is None:
        return None
    if opt.parse is not None:
        try:
            opt.parse(items(value))
        except ValueError as exc:
            return f"{name}: {exc}"
        return None
    if opt.choices is not None:
        given = items(value) if opt.many else [value]
        if opt.many and not given and not empty_ok:
            return f"{name} needs at least one of: {', '.join(opt.choices)}"
        for item in given:
            if item not in opt.choices:
                return f"{name}: unknown {noun or opt.noun} '{item}'; valid: {', '.join(opt.choices)}"
    if opt.low is not None and opt.high is not None:
        return out_of_range(name, value, opt.low, opt.high)
    if opt.seconds is not None:
        return seconds_problem(name, value, positive=opt.seconds[0], limit=opt.seconds[1])
    return None


def seconds_problem(name: str, value: float, *, positive: bool, limit: float = math.inf) -> str | None:
    """A duration: a finite number of seconds, > 0 (positive) or >= 0, and at most `limit`."""
    low_ok = value > 0 if positive else value >= 0
    if math.isfinite(value) and low_ok and value <= limit:
        return None
    bounds = f"{'> 0' if positive else '>= 0'}" + (f" and <= {limit:g}" if math.isfinite(limit) else "")
    return f"{name} takes a finite number of seconds {bounds} (got {value:g})"


def check(request: Any, options: Mapping[str, Opt], names: Iterable[str] | None = None) -> None:
    """The one check of a request's options (those of `names`, default all it has), named by their flags."""
    for name in names if names is not None else options:
        found = problem(options[name].flag, options[name], getattr(request, name, None)) if name in options else None
        if found:
            raise RequestError(found)
