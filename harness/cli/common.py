"""What every command module shares: the consoles, the argument helpers and the options."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from harness.core.terminal import terminal_lines, terminal_text

console = Console()
if not console.is_terminal:  # logs and CI: rich would fold every table to 80 columns
    console.width = 160
errors = Console(stderr=True)

DbOption = Annotated[Path, typer.Option("--db", help="DuckDB file.")]
OutputDirOption = Annotated[Path, typer.Option("--output-dir", help="Where the reports and the matrix go.")]
# The one run-selector grammar (harness.store.Store.resolve_run), for every option that names a run.
RUN_SELECTOR = "latest, previous, latest-on-<branch>, a run id or its start, or a suite name"
RunOption = Annotated[str, typer.Option("--run", help=f"The run: {RUN_SELECTOR}.")]
RunsOption = Annotated[str, typer.Option("--run", help=f"The run ({RUN_SELECTOR}), RUN,RUN,… for several, or all.")]


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


def split_list(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


def int_list(option: str, value: str) -> list[int]:
    try:
        return [int(v) for v in split_list(value) or []]
    except ValueError:
        raise fail(f"{option} takes comma-separated integers >= 1, e.g. 1,4 (got '{value}')") from None


# Options shared by the commands that run benchmarks (native, web, run).
ModelOption = Annotated[
    str | None, typer.Option("--model", help="Comma-separated model names (`accelharness models`).")
]
FamiliesOption = Annotated[
    str | None, typer.Option("--model-families", help="embedding,text_generation,vision,audio,multimodal")
]
SmallOption = Annotated[bool, typer.Option("--small-models", help="Use the tiny variant of each selected family.")]
ModelPathOption = Annotated[
    Path | None, typer.Option("--model-path", help="A local HF model directory or an .onnx file.")
]
BatchOption = Annotated[str, typer.Option("--batch-sizes", help="Comma-separated batch sizes.")]
SeqOption = Annotated[str, typer.Option("--sequence-lengths", help="Comma-separated sequence lengths (text inputs).")]
WarmupOption = Annotated[int, typer.Option("--warmup", help="Untimed runs after the first run.")]
IterationsOption = Annotated[int, typer.Option("--iterations", help="Minimum timed iterations.")]
MinDurationOption = Annotated[float, typer.Option("--min-duration", help="Minimum seconds of timed iterations.")]
MaxIterationsOption = Annotated[int, typer.Option("--max-iterations", help="Cap on timed iterations.")]
MaxTimeOption = Annotated[
    float,
    typer.Option(
        "--max-time",
        help="Seconds of warmup + timed iterations per case (0: no budget). Once spent, the loop stops "
        "after --min-iterations samples; the row records that the budget stopped it.",
    ),
]
MinIterationsOption = Annotated[
    int, typer.Option("--min-iterations", help="Timed iterations a case runs even when --max-time is spent.")
]
TimeoutOption = Annotated[
    float, typer.Option("--timeout", help="Seconds a worker or page may go without finishing a case.")
]
ProfileOption = Annotated[
    bool,
    typer.Option(
        "--profile",
        help="After each inference case's timed loop, a few profiled iterations: time per operator (node, op type, "
        "provider), stored with the result (`query --report ops`, the HTML report, `predict`).",
    ),
]
ResumeOption = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="Continue the latest run of this command with the same options if it did not complete "
        "(Ctrl-C, kill -9): only the results it lacks are run.",
    ),
]
MachineLabelOption = Annotated[
    str | None,
    typer.Option(
        "--machine-label",
        help="Name this machine in reports across machines (default: ACCELHARNESS_MACHINE_LABEL); letters, "
        "digits, '.', '_', '-', at most 64.",
    ),
]
MachineOption = Annotated[
    str | None,
    typer.Option(
        "--machine",
        help="Learn from this machine's runs only: an exact machine id, a unique id prefix of at least 8 characters, "
        "or an exact label (`query --report machines`).",
    ),
]
