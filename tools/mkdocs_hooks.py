"""MkDocs hooks (mkdocs.yml): pages made at build time from what the repository already holds, so
nothing is written twice. The command reference is one page per command of the Typer app
(harness.cli.reference); "The parts" is ARCHITECTURE.md itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

from harness.cli.reference import PROGRAM, command_page, commands, index_page, page_name

ROOT = Path(__file__).resolve().parents[1]
CLI_DIR = "cli"
PARTS_PAGE = "architecture-parts.md"


def on_config(config: Any) -> Any:
    """The reference's pages in the nav, after the hand-written ones."""
    pages = [{f"{PROGRAM} {name}": f"{CLI_DIR}/{page_name(name)}"} for name in commands()]
    config["nav"].append({"Command reference": [f"{CLI_DIR}/index.md", *pages]})
    return config


def on_files(files: Files, config: Any) -> Files:
    generated = {f"{CLI_DIR}/index.md": index_page(), PARTS_PAGE: (ROOT / "ARCHITECTURE.md").read_text()}
    generated |= {f"{CLI_DIR}/{page_name(name)}": command_page(name, cmd) for name, cmd in commands().items()}
    for path, content in generated.items():
        files.append(File.generated(config, path, content=content))
    return files
