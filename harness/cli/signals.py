"""How the CLI takes a stop: Ctrl-C (SIGINT) and SIGTERM end a run the same way.

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


def interrupted(resumable: bool = True) -> typer.Exit:
    """Say the run stopped, what is kept and how to go on; the exit for the signal that stopped it."""
    number = signal.SIGTERM if signal.SIGTERM in _received else signal.SIGINT
    kept = f"interrupted by {number.name}: every finished result is stored, and the run is marked interrupted"
    if resumable:
        how = f"continue with: {resume_command()}"
    else:  # ab: its verdict pairs rounds measured together, so it starts over
        how = "ab has no --resume (its verdict pairs rounds measured side by side): run it again"
    errors.print(f"{escape(kept)}; {escape(how)}", highlight=False, soft_wrap=True)
    return typer.Exit(128 + number)
