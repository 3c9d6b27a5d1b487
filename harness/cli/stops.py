"""How the CLI takes a stop: Ctrl-C (SIGINT) and SIGTERM end a run the same way; a store that
cannot be written (a full disk) ends it too, with one line instead of DuckDB's chain of tracebacks.

SIGTERM is handed to whatever takes SIGINT at that moment: Python's handler, which raises
KeyboardInterrupt, or asyncio's while a browser's event loop runs, which cancels its main task
(an exception raised into the loop's own code could be swallowed there). Either way every
`except KeyboardInterrupt` and `except BaseException` on the way up does what it does for Ctrl-C:
the workers' groups and the browsers are stopped, the run is closed `interrupted` with every
finished row kept. Then the command prints how to continue and exits 128 + the signal's number.
"""

from __future__ import annotations

import shlex
import signal
import sys
from types import FrameType

import typer
from rich.markup import escape

from harness.cli.common import errors
from harness.store import StoreWriteError

_received: set[signal.Signals] = set()  # SIGTERM once it came: the exit code says which signal stopped the run


def _terminate(signum: int, frame: FrameType | None) -> None:
    _received.add(signal.SIGTERM)
    on_interrupt = signal.getsignal(signal.SIGINT)
    if not callable(on_interrupt):  # SIGINT ignored or defaulted since: stop here all the same
        raise KeyboardInterrupt
    on_interrupt(signum, frame)


def install_handlers() -> None:
    """Take SIGINT and SIGTERM explicitly, whatever this process inherited.

    A shell without job control starts a background job (`cmd &` in a script) with SIGINT ignored,
    and Python keeps "ignored" rather than installing its Ctrl-C handler: `kill -INT` to the job's
    group would then be lost and the run go on. A handler, unlike "ignored", is not inherited
    across exec, so the workers and browsers this process starts are unaffected."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)


def resume_command() -> str:
    """This very command line with --resume: what continues the run it was running."""
    arguments = sys.argv[1:]
    return shlex.join(["accelharness", *arguments, *([] if "--resume" in arguments else ["--resume"])])


def _how_to_continue(resumable: bool) -> str:
    if resumable:
        return f"continue with: {resume_command()}"
    return "ab has no --resume (its verdict pairs rounds measured side by side): run it again"


def interrupted(resumable: bool = True) -> typer.Exit:
    """Say the run stopped, what is kept and how to go on; the exit for the signal that stopped it."""
    number = signal.SIGTERM if signal.SIGTERM in _received else signal.SIGINT
    kept = f"interrupted by {number.name}: every finished result is stored, and the run is marked interrupted"
    errors.print(f"{escape(kept)}; {escape(_how_to_continue(resumable))}", highlight=False, soft_wrap=True)
    return typer.Exit(128 + number)


def stopped(failure: StoreWriteError, resumable: bool = True) -> typer.Exit:
    """A run the store stopped (a full disk): one line with the reason, what is kept, how to go on; exit 1."""
    remedy = "free space, then" if failure.disk_full else "once it can be written,"
    line = f"{failure}. Every result before it is stored; {remedy} {_how_to_continue(resumable)}"
    errors.print(f"[red]error:[/red] {escape(line)}", highlight=False, soft_wrap=True)
    return typer.Exit(1)
