"""The CLI reference, from the Typer app itself: every command (`db init` included) and its options,
as the Markdown pages of the manual (tools/mkdocs_hooks.py adds one page per command at `make docs`) and as
the option sets tests/test_docs.py checks every documented command line against."""

from __future__ import annotations

from typing import Any

import typer

from harness.cli import app

PROGRAM = "accelharness"


def commands() -> dict[str, Any]:
    """Every runnable command by its name on the command line ("native", "db init"), in --help order."""
    found: dict[str, Any] = {}

    def walk(group: Any, prefix: str) -> None:
        for name, command in group.commands.items():
            if hasattr(command, "commands"):
                walk(command, f"{prefix}{name} ")
            else:
                found[f"{prefix}{name}"] = command

    walk(typer.main.get_command(app), "")
    return found


def option_names(command: Any) -> set[str]:
    """Every spelling of every option the command takes (--flag and --no-flag alike), and --help."""
    names = {"--help"}
    for param in command.params:
        if param.param_type_name == "option":
            names.update(param.opts, param.secondary_opts)
    return names


def page_name(name: str) -> str:
    return name.replace(" ", "-") + ".md"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def command_page(name: str, command: Any) -> str:
    """One command's page: what it does, its usage line, and a table of its arguments and options."""
    ctx = typer.main.get_command(app).context_class(command, info_name=f"{PROGRAM} {name}")
    lines = [f"# {PROGRAM} {name}", "", _cell(command.help or ""), "", "```", command.get_usage(ctx), "```", ""]
    lines += ["| argument or option | what |", "|---|---|"]
    for param in command.params:
        record = param.get_help_record(ctx)
        if record is None:  # hidden
            continue
        names, what = record
        lines.append(f"| `{_cell(names)}` | {_cell(what)} |")
    lines += ["", f"Generated from the Typer app (`{PROGRAM} {name} --help` prints the same)."]
    return "\n".join(lines) + "\n"


def index_page() -> str:
    """The reference's front page: every command with its one-line summary."""
    lines = ["# Command reference", "", "Generated from the Typer app at every build: one page per command.", ""]
    lines += ["| command | what it does |", "|---|---|"]
    for name, command in commands().items():
        lines.append(f"| [`{PROGRAM} {name}`]({page_name(name)}) | {_cell(command.get_short_help_str(200))} |")
    return "\n".join(lines) + "\n"
