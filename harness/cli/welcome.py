"""`accelharness` with no command: the three commands a newcomer needs, then where everything else is."""

from __future__ import annotations

import typer

# (command, what it answers): tests/test_docs.py parses each against the app, so none can name a gone option
FIRST_COMMANDS = (
    ("accelharness hardware", "what this machine can run, and why not"),
    ("accelharness run --model bert-tiny --hardware cpu --web-hardware wasm", "measure natively and in Chromium"),
    ("accelharness report --run latest --format html", "that run as one self-contained HTML page"),
)


def welcome(ctx: typer.Context) -> None:
    """Print the three commands a newcomer needs when `accelharness` is given no command; nothing otherwise."""
    if ctx.invoked_subcommand is not None:
        return
    width = max(len(command) for command, _ in FIRST_COMMANDS)
    lines = [f"  {command:<{width}}  # {why}" for command, why in FIRST_COMMANDS]
    typer.echo(
        "accelharness: how fast a model runs on each device, measured, in one DuckDB file.\n\n"
        "Start with:\n" + "\n".join(lines) + "\n\n"
        "Every command: accelharness --help. The manual: docs/ in the repository (`make docs` builds the site)."
    )
