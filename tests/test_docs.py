"""The manual (docs/, built by MkDocs) and the README: the site builds in strict mode and a broken link
fails it; every command line they show names a command and options the Typer app has (and parses
where it is literal); every other example is run by a named test or says why it cannot run here."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest
from conftest import run_cli
from test_isolation import readme_api_example

import harness
from harness.cli.reference import commands, option_names
from harness.cli.welcome import FIRST_COMMANDS
from harness.store import open_store

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
MKDOCS = Path(sys.executable).with_name("mkdocs")
# a block that is not only accelharness command lines says, on the line before it, what runs it or why
# nothing can here: <!-- example: runs in tests/FILE.py::TEST --> or <!-- example: not run here: WHY -->
MARKER = re.compile(r"<!-- example: (?:runs in (?P<test>tests/\S+\.py::\w+)|not run here: (?P<why>.+?)) -->")
COMMAND = re.compile(r"(?:^|[\s/(])accelharness\s+(?P<rest>[a-z].*)")
PLACEHOLDERS = re.compile(r"[\[\]|…]|\.\.\.|\b[A-Z_]{3,}\b")  # [--opt], a|b, RUN: syntax, not a value


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    body: list[str]
    marker: re.Match[str] | None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """Every fenced code block of a page, with the example marker on the line before it, if any."""
    lines, found, start = page.read_text().splitlines(), [], None
    for number, line in enumerate(lines):
        fence = re.match(r"\s*```(\w*)", line)
        if fence and start is None:
            start, language = number, fence.group(1)
        elif fence:
            before = lines[start - 1] if start else ""
            found.append(Block(page.name, start + 1, language, lines[start + 1 : number], MARKER.search(before)))
            start = None
    return found


def logical_lines(block: Block) -> list[str]:
    """The block's lines with shell continuations (a trailing backslash) and YAML folded scalars joined."""
    joined: list[str] = []
    folding = None  # the indent of the YAML key whose folded scalar is being joined
    for raw in block.body:
        line = raw.split(" #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
        indent = len(raw) - len(raw.lstrip())
        if joined and (joined[-1].endswith("\\") or (folding is not None and indent > folding and line)):
            joined[-1] = joined[-1].removesuffix("\\") + " " + line.strip()
            continue
        folding = indent if line.endswith(": >") else None
        joined.append(line)
    return [line for line in joined if line.strip()]


def command_lines(block: Block) -> list[str]:
    """The accelharness invocations in a block: what follows `accelharness` up to the end of the command."""
    found = []
    for line in logical_lines(block):
        for match in COMMAND.finditer(line):
            found.append(re.split(r"\s(?:&&|>>|2>&1|>)\s?", match.group("rest"))[0].strip())
    return found


def all_blocks() -> list[Block]:
    return [block for page in PAGES for block in blocks(page)]


def check_command_line(text: str) -> list[str]:
    """What is wrong with one documented command line: an unknown command or option; a literal line that
    the command's parser refuses."""
    known = commands()
    words = text.split()
    name = " ".join(words[:2]) if words[0] == "db" else words[0]
    if name not in known:
        return [f"`accelharness {text}`: no command '{name}'"]
    command, problems = known[name], []
    for token in words[len(name.split()) :]:
        for option in re.findall(r"(?<![\w-])--[a-z][\w-]*", token.split("=")[0] if "=" in token else token):
            if option not in option_names(command):
                problems.append(f"`accelharness {text}`: {name} has no option {option}")
    if not problems and not PLACEHOLDERS.search(text):
        args = shlex.split(text)[len(name.split()) :]
        try:
            command.make_context(f"accelharness {name}", args, resilient_parsing=False).close()
        except Exception as exc:  # click's usage errors: a flag given a value, a missing value
            problems.append(f"`accelharness {text}` does not parse: {exc}")
    return problems


# --- the site ------------------------------------------------------------------------------------------------


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


def test_the_docs_build_in_strict_mode_and_a_broken_link_fails_them(tmp_path: Path) -> None:
    """The site builds with every page and a generated reference page per command; the same docs with one
    link to a page that does not exist fail the strict build, naming the link."""
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr
    for name in commands():
        assert (tmp_path / "site" / "cli" / (name.replace(" ", "-") + ".html")).is_file(), name
    assert "--max-time" in (tmp_path / "site" / "cli" / "native.html").read_text()
    copy = tmp_path / "copy"
    for part in ("docs", "tools"):
        shutil.copytree(ROOT / part, copy / part)
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    (copy / "ARCHITECTURE.md").write_text((ROOT / "ARCHITECTURE.md").read_text())
    with (copy / "docs" / "store.md").open("a") as page:
        page.write("\nSee [the schema](schema.md).\n")
    broken = build(copy / "mkdocs.yml", tmp_path / "broken")
    assert broken.returncode != 0 and "schema.md" in broken.stderr, broken.stderr


def test_the_readme_is_short_and_its_two_commands_are_make_targets() -> None:
    """The README fits in about 200 lines and its two commands are targets the Makefile has."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    made = [line.split()[1] for block in blocks(ROOT / "README.md") for line in logical_lines(block) if
            line.startswith("make ")]  # fmt: skip
    assert made[:2] == ["demo", "test"], made
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    assert set(made) <= targets, set(made) - targets


def test_the_readme_picture_is_a_file_in_docs() -> None:
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", (ROOT / "README.md").read_text())
    assert pictures and all((ROOT / p).is_file() and p.startswith("docs/") for p in pictures), pictures


# --- examples ------------------------------------------------------------------------------------------------


def test_every_documented_command_line_names_what_the_app_has() -> None:
    """Every accelharness command line in the README, the docs and the no-command welcome: the command exists,
    every option it names exists on it, and a line with no placeholders parses as written."""
    lines = [line for block in all_blocks() for line in command_lines(block)]
    lines += [command.removeprefix("accelharness ") for command, _ in FIRST_COMMANDS]
    assert len(lines) > 50  # the pages hold more: a parser that finds none must not pass
    problems = [problem for line in lines for problem in check_command_line(line)]
    assert not problems, "\n".join(problems)


def test_a_gone_option_is_caught() -> None:
    """The check fails on an option the app does not have, on an unknown command and on a misparse."""
    assert check_command_line("native --model bert-tiny --no-such-option 3")
    assert check_command_line("benchmark --model bert-tiny")
    assert check_command_line("native --small-models yes --model-families vision")
    assert not check_command_line("native --model bert-tiny --hardware cpu --batch-sizes 1,4")


def test_every_other_example_is_run_by_a_named_test_or_says_why_not() -> None:
    """A block that is not only accelharness command lines carries a marker: the test that runs it (which
    must exist), or why it cannot run here."""
    problems = []
    for block in all_blocks():
        only_commands = block.language == "bash" and all(
            COMMAND.match(line) or line.startswith(".venv/bin/accelharness") for line in logical_lines(block)
        )
        if only_commands:
            continue
        if block.marker is None:
            problems.append(f"{block.where}: a {block.language or 'plain'} block without an example marker")
        elif block.marker.group("test"):
            file, name = block.marker.group("test").split("::")
            if f"def {name}(" not in (ROOT / file).read_text():
                problems.append(f"{block.where}: {file} has no test {name}")
    assert not problems, "\n".join(problems)


def python_blocks() -> list[Block]:
    return [block for block in all_blocks() if block.language == "python"]


@pytest.mark.parametrize("block", python_blocks(), ids=lambda b: b.where)
def test_python_examples_call_what_the_api_has(block: Block) -> None:
    """Each Python example compiles, imports only names the harness exports, and passes only keyword
    arguments its callees take (a request's fields, a function's parameters)."""
    tree = ast.parse("\n".join(block.body))
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "harness"
        for alias in node.names
    }
    assert imported and imported <= set(harness.__all__), imported - set(harness.__all__)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in imported:
            callee = getattr(harness, node.func.id)
            names = (
                {f.name for f in dataclasses.fields(callee)}
                if dataclasses.is_dataclass(callee)
                else set(inspect.signature(callee).parameters)
            )
            unknown = {k.arg for k in node.keywords if k.arg} - names
            assert not unknown, f"{block.where}: {node.func.id} takes no {unknown}"


def test_the_sql_example_runs_on_a_store(tmp_path: Path) -> None:
    """The store page's SQL runs on a real store with the current schema (its columns exist)."""
    (sql,) = [block for page in DOCS for block in blocks(page) if block.language == "sql"]
    db = tmp_path / "s.duckdb"
    with open_store(db):
        pass
    with duckdb.connect(str(db), read_only=True) as connection:
        assert connection.execute("\n".join(sql.body)).fetchall() == []


def test_the_ab_api_example_runs(tmp_path: Path) -> None:
    """The manual's A/B example as the page has it, after its first example (quick, as test_isolation runs
    it), whose run `compare_runs(..., "previous", "latest")` needs: bert-tiny against its int8 copy on ONNX
    Runtime, a paired verdict per case, and a comparison across time."""
    (example,) = [b for page in DOCS for b in blocks(page) if "run_ab(" in "\n".join(b.body)]
    script = readme_api_example() + "\n" + "\n".join(example.body)
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "cpu/onnxruntime:CPUExecutionProvider" in done.stdout
    assert re.search(r"\b(unchanged|improved|regressed|noisy)\b", done.stdout), done.stdout


def test_no_command_prints_the_three_first_commands() -> None:
    """`accelharness` alone: the three commands a newcomer needs and where the rest is, exit 0;
    --help still lists every command."""
    done = subprocess.run([sys.executable, "-m", "harness.cli"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stdout.splitlines() if line.startswith("  accelharness ")] == [
        f"  {command:<{max(len(c) for c, _ in FIRST_COMMANDS)}}  # {why}" for command, why in FIRST_COMMANDS
    ]
    assert "docs/" in done.stdout
    listed = run_cli("--help")  # the app in this process: a second Python start is ~0.8 s of CPU
    assert all(name.split()[0] in listed.stdout for name in commands())
