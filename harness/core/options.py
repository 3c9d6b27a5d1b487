"""One definition per option: a request dataclass's field carries its flag, help, bound and choices, and
everything that takes the option is built from it and checked by `check()` (the command line's flags, the
suite config's keys, the Python API's dataclass). optimum-benchmark's one config tree is the model.

    warmup: int = option(5, flag="--warmup", key="warmup_iterations", low=0, high=MAX_ITERATIONS, help="…")

Adding an option is one field: its flag appears on every command built from the dataclass (harness.cli.common
generates their signatures), its key in the suite config, and its check runs wherever the request is checked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from harness.core.bounds import out_of_range

OPTION = "option"  # the key of a field's metadata that holds its Opt
# The longest duration (--timeout, --max-time): beyond it a case is a hang, and asyncio/JS timers stop being exact.
MAX_TIMEOUT_S = 7 * 24 * 3600.0
DEFAULT_OUTPUT_DIR = Path("accelharness-results")  # where a run's and a command's reports go, unless --output-dir
# The one run-selector grammar (harness.store.Store.resolve_run), in the help of every option that names a run.
RUN_SELECTOR = "latest, previous, latest-on-<branch>, a run id or its start, or a suite name"


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

    def narrowed(self, choices: tuple[str, ...] | None = None, many: bool | None = None, note: str = "") -> Opt:
        """The option in one command, whose values come from that command's own table (`--format`: compare's
        FORMATS, export's EXPORT_FORMATS): the declared help, then the choices, then what only this command adds
        (`note`). Flag, bound and the help's stem stay the declaration's."""
        many = self.many if many is None else many
        listed = f" {'Comma-separated, of' if many else 'One of'}: {', '.join(choices)}." if choices else ""
        help_text = f"{self.help}{listed}{f' {note}' if note else ''}"
        return replace(self, choices=choices or self.choices, many=many, help=help_text)


def option(default: Any = MISSING, *, factory: Any = MISSING, **declared: Any) -> Any:
    """A dataclass field that is an option (`declared` are Opt's fields)."""
    return field(default=default, default_factory=factory, metadata={OPTION: Opt(**declared)})


def reuse(
    request: Any,
    name: str,
    *,
    prefix: str | None = None,
    choices: tuple[str, ...] | None = None,
    many: bool | None = None,
    note: str = "",
    **default: Any,
) -> Any:
    """A field of another request declared by `request`'s field `name`: the same option (flag, help, bound,
    choices; its flag `prefixed`, its choices `narrowed` to this command's table), with this request's own
    default (`default=` or `factory=`; neither: the option is required)."""
    opt = declared(request)[name].prefixed(prefix)
    if choices is not None or many is not None or note:
        opt = opt.narrowed(choices, many, note)
    return field(default=default.get("default", MISSING), default_factory=default.get("factory", MISSING),
                 metadata={OPTION: opt})  # fmt: skip


def declared(cls: Any) -> dict[str, Opt]:
    """The options a request dataclass declares, by field name, in field order."""
    return {f.name: f.metadata[OPTION] for f in fields(cls) if OPTION in f.metadata}


def default_of(f: Field) -> Any:
    return f.default_factory() if f.default_factory is not MISSING else f.default


# A whole number as the command line and a config's text give it: ASCII digits, a '-' for a range's message.
# int() takes more ('１２', '1_000', '+3', ' 7 '): a typo or a lookalike would run as a number nobody typed.
WHOLE_NUMBER = re.compile(r"-?[0-9]+")


def whole_number(value: Any) -> int:
    """An integer option's value: an int (not a bool), or text of ASCII digits; ValueError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and WHOLE_NUMBER.fullmatch(value):
        return int(value)
    raise ValueError(f"not a whole number in ASCII digits: {value!r}")


def empty_item(name: str, text: str) -> str | None:
    """The message for a comma-separated value with an empty item ('1,,2', ',', '5,', ''), or None: an empty
    item is a typo, and dropping it (or taking the default for an empty list) runs what nobody asked for."""
    if all(part.strip() for part in text.split(",")):
        return None
    return f"{name} takes comma-separated values, none of them empty (got '{text}')"


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
    # a text list from the API or a config ('1,,2'); an empty one is the suite config's empty list (empty_ok)
    if opt.many and isinstance(value, str) and (value.strip() or not empty_ok) and (bad := empty_item(name, value)):
        return bad
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


@dataclass(frozen=True, kw_only=True)
class Shared:
    """The options that commands of more than one part take (a benchmark's --db is a report's, suite's
    --fail-on-regression is compare's and ab's), each declared once here. Never built: a command's or a
    request's field takes one with `reuse(Shared, name, default=…)`, its choices narrowed to its own table; a
    switch (False unless given) is taken as it is (`with_options(Shared, ("resume",))`)."""

    db_path: Path = option(flag="--db", key="db", help="DuckDB file.")
    output_dir: Path | None = option(flag="--output-dir", help="Where the reports and the matrix go.")
    model_path: Path | None = option(flag="--model-path", help="A local HF model directory or an .onnx file.")
    resume: bool = option(
        False,
        flag="--resume",
        help="Continue the latest run of this command (suite: of this config) with the same options if it did "
        "not complete (Ctrl-C, kill -9): only the results it lacks are run.",
    )
    run: str = option(flag="--run", help=f"The run: {RUN_SELECTOR}.")
    baseline: str | None = option(flag="--baseline", help=f"The run to compare with: {RUN_SELECTOR}.")
    threshold: str = option(flag="--threshold", help="The smallest change that counts: 5% or 0.05.")
    fail_on_regression: bool = option(False, flag="--fail-on-regression", help="Exit 1 if any case regressed or broke.")
    fmt: str = option(flag="--format", noun="format", help="The output's format.")
    out: Path | None = option(flag="--out", help="Write the output here.")
    update_matrix_only: bool = option(
        False,
        flag="--update-matrix-only",
        help="Only rebuild the compatibility matrix files from the store; nothing is run.",
    )
    # a filter of what is read or run (analysis, suite); the benchmarks' --hardware is the platforms they run on
    hardware: str | None = option(flag="--hardware", help="Only these hardware platforms.")
