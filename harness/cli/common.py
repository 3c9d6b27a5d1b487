"""What every command module shares: the consoles, the argument helpers and the options."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterable
from dataclasses import MISSING, fields
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from harness.core.options import OPTION, Opt, declared, default_of, empty_item, problem, whole_number
from harness.core.terminal import terminal_lines, terminal_text

console = Console()
if not console.is_terminal:  # logs and CI: rich would fold every table to 80 columns
    console.width = 160
errors = Console(stderr=True)


def shown(value: object) -> str:
    """Stored text (a machine label, a model name, an error from a device or a bundle) for a rich console
    line or table cell: no control characters (terminal_text), no markup ([run] is text)."""
    return escape(terminal_text(str(value)))


def say(text: str) -> None:
    """Print plain text (pipeable, no rich markup) whose lines may hold stored text: each made safe."""
    typer.echo(terminal_lines(text))


def fail(message: str) -> typer.Exit:
    """Print a one-line error and return the exit for bad input (code 2). Errors quote stored text
    (an unknown machine, a device's message), so the line goes through shown like every other."""
    errors.print(f"[red]error:[/red] {shown(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


def given(ctx: typer.Context, *names: str) -> list[str]:
    """The options among `names` (parameter names) the user passed, as their flags: an option left at
    its default is not "given", so one that does nothing in the chosen mode is refused only when passed."""
    flags = {param.name: param.opts[0] for param in ctx.command.params}
    # By the enum's name: Typer runs on its own copy of click, whose ParameterSource is another class.
    sources = {name: getattr(ctx.get_parameter_source(name), "name", None) for name in names}
    return [flags[name] for name in names if sources[name] in ("COMMANDLINE", "ENVIRONMENT")]


def split_list(value: str | None, flag: str = "a comma-separated option") -> list[str] | None:
    """A comma-separated value's items (None: not given); an empty item ('1,,2', ',', '') exits 2 naming `flag`."""
    if value is None:
        return None
    if found := empty_item(flag, value):
        raise fail(found)
    return [v.strip() for v in value.split(",")]


def _bounds(opt: Opt) -> str:
    """What whole numbers an option takes, for its message: ' from 1 to 256', ' >= 0', or ''."""
    if opt.low is not None and opt.high is not None:
        return f" from {opt.low} to {opt.high:,}"
    return f" >= {opt.low}" if opt.low is not None else ""


def int_list(opt: Opt, value: str) -> list[int]:
    """A comma-separated list of whole numbers, each ASCII digits (harness.core.options.whole_number)."""
    try:
        return [whole_number(v) for v in split_list(value, opt.flag) or []]
    except ValueError:
        example = f"{opt.low or 0},{max(opt.low or 0, 4)}"
        wanted = f"comma-separated integers{_bounds(opt)} in ASCII digits, e.g. {example}"
        raise fail(f"{opt.flag} takes {wanted} (got '{value}')") from None


def _number(opt: Opt, kind: type, value: Any) -> Any:
    """One number option's command-line text as `kind` (int or float): ASCII only, as a list's items are (float()
    and int() take '１２' and '1_0'); Click passes the declared default through here too, already a number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    try:
        if kind is int:
            return whole_number(value.strip())
        if value.isascii() and "_" not in value:
            return float(value)
    except ValueError:
        pass
    what = f"a whole number{_bounds(opt)} in ASCII digits" if kind is int else "a number in ASCII digits, e.g. 2.5"
    raise fail(f"{opt.flag} takes {what} (got '{value}')")


def _numeric(hint: Any) -> type | None:
    """int or float where an option's command-line type is one (`int | None` too), else None."""
    kinds = [k for k in (hint, *typing.get_args(hint)) if k in (int, float)]
    return kinds[0] if kinds else None


# No option is written here or in any command module: each is a field of a request or of a command's options
# dataclass (harness.run.plan, harness.analysis.options, harness.suite.options, …), declared with option() once,
# and with_options() makes those fields the command's parameters (tests/test_options.py fails on a typed one).


# --- commands built from the request dataclasses (harness.core.options) ---------------------------------


def with_options(
    request: type, names: Iterable[str] | None = None, *, overrides: bool = False, prefix: str | None = None
) -> Callable[[Any], Any]:
    """Add the options `names` (fields of `request`) to a command's parameters, after its own: each field's
    flag, help and default, written once on the field. The command takes them as **options, parsed by
    request_values(), or as parameters of the same name (typed only here). `overrides`: each defaults to None,
    "the config's" (suite). `prefix`: in a command with a native and a browser half, the browser's option
    (Opt.prefixed: `run --web-hardware` is WebRequest's --hardware), its parameter named `{prefix}_{name}`.
    No `names`: every option `request` declares (a command's own options dataclass)."""
    names = tuple(declared(request) if names is None else names)

    def wrap(command: Any) -> Any:
        signature = inspect.signature(command, eval_str=True)  # typer reads a __signature__ as it is
        added = [_parameter(request, name, overrides, prefix) for name in names]
        taken = {p.name for p in added}
        own = [
            p
            for p in signature.parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD and p.name not in taken
        ]
        command.__signature__ = signature.replace(parameters=[*own, *added])
        return command

    return wrap


def _parameter(request: type, name: str, overrides: bool, prefix: str | None) -> inspect.Parameter:
    found = {f.name: f for f in fields(request)}[name]
    opt: Opt = found.metadata[OPTION].prefixed(prefix)
    kind, default = _command_line_form(opt, typing.get_type_hints(request)[name], default_of(found))
    help_text = opt.help
    if default is MISSING:  # declared without a default: the command requires it (history --model)
        default = inspect.Parameter.empty
    if overrides:
        kind, default = kind | None, None
        help_text += f" Default: the config's {opt.key or name}."
    number = _numeric(kind)  # a number's text is parsed here, not by Click's int()/float() (Unicode digits)
    parser = (lambda text: _number(opt, number, text)) if number is not None else None
    annotation = Annotated[kind, typer.Option(opt.flag, help=help_text, parser=parser)]  # type: ignore[valid-type]
    parameter = f"{prefix}_{name}" if prefix else name
    return inspect.Parameter(parameter, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def _command_line_form(opt: Opt, hint: Any, default: Any) -> tuple[Any, Any]:
    """The command line's type and default of an option: a list is one comma-separated string (or the flag
    repeated, none given: None), and an option whose 0 means None (--max-time) a plain number."""
    if opt.repeat:
        return list[str] | None, None
    if opt.many:
        text = default if default is None or isinstance(default, str) else ",".join(str(v) for v in default)
        return (str | None if text is None else str), text
    if opt.zero_is_none:
        return float, default or 0.0
    return hint, default


def request_values(request: type, options: dict[str, Any], prefix: str | None = None) -> dict[str, Any]:
    """The parsed values of the options with_options() added (by field name; `prefix`: as it named them):
    lists split (whole numbers as integers), an empty item or a bad number exit 2 naming the flag, 0 None where
    it means none."""
    found = {f.name: f for f in fields(request)}
    hints = typing.get_type_hints(request)
    values = {}
    for parameter, value in options.items():
        name = parameter.removeprefix(f"{prefix}_") if prefix else parameter
        opt: Opt = found[name].metadata[OPTION].prefixed(prefix)
        default = default_of(found[name])
        if opt.repeat:
            value = value or default
        elif value is None:  # an override left out, or an option whose default is None
            pass
        elif opt.many and (opt.low is not None or _numeric_list(hints[name])):
            value = int_list(opt, value)
        elif opt.many and not isinstance(default, str):
            value = split_list(value, opt.flag)
        elif opt.many:  # a text the request parses itself (--precision encoder=fp32,decoder=q4), checked here
            split_list(value, opt.flag)
        elif opt.zero_is_none:
            value = value or None
        values[name] = value
    return values


def _numeric_list(hint: Any) -> bool:
    """Whether a many-valued option's field holds whole numbers (`list[int] | None`: --prompt-ids)."""
    return any(typing.get_args(k) == (int,) for k in (hint, *typing.get_args(hint)))


def refuse_bad(request: type, **values: Any) -> None:
    """The one check (harness.core.options.problem) of a command's option values, by their declared bound and
    choices: the first wrong one exits 2 naming its flag."""
    options = declared(request)
    for name, value in values.items():
        if found := problem(options[name].flag, options[name], value):
            raise fail(found)
