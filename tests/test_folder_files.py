"""Issue 42 item 4: every file a model folder names is read by one reader (harness.prepare.folder_checks.read_file):
a regular file, bounded before it is read, opened so that it cannot block. A FIFO named config.json hung
`native --model-path` for good (its size is 0, then the read waited for a writer); a FIFO, a socket or a directory
by a folder's file name is now refused by name before a run exists: exit 2, one line, no traceback, no store."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_cli_process
from int4_models import matmul_model

from harness.prepare.folder_checks import FolderError, read_config, read_file, read_regular

NATIVE = ("native", "--hardware", "cpu", "--engines", "onnxruntime", "--batch-sizes", "1", "--iterations", "1",
          "--warmup", "0", "--min-duration", "0")  # fmt: skip
NOT_REGULAR = "not a regular file"


@pytest.fixture(autouse=True)
def no_hang() -> Iterator[None]:
    """A read that blocks fails the test after 20 s instead of hanging it (SIGALRM interrupts a blocked open)."""

    def hung(signum: int, frame: object) -> None:
        raise TimeoutError("a read of a folder's file blocked")

    before = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def optimum_folder(root: Path) -> Path:
    """An optimum layout (model.onnx + config.json) of a tiny MatMul graph: what the CLI takes as a folder."""
    folder = root / "f"
    folder.mkdir()
    matmul_model(folder / "model.onnx")
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    return folder


def special(path: Path, kind: str) -> socket.socket | None:
    """Make `path` a FIFO, a socket (the bound socket returned: it lives as long as it is open) or a directory."""
    if path.exists():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        bound = socket.socket(socket.AF_UNIX)
        bound.bind(str(path))
        return bound
    return None


def refused(model_path: Path, tmp_path: Path, *extra: str) -> str:
    """The CLI's one line for a native run of the model path, which must be refused within seconds: exit 2, no
    traceback, nothing written to the store."""
    db = tmp_path / "refused.duckdb"
    started = time.monotonic()
    done = run_cli_process(*NATIVE, "--model-path", str(model_path), "--db", str(db), *extra, cwd=tmp_path, timeout=60)
    assert time.monotonic() - started < 60
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and not db.exists()
    return " ".join(done.stderr.split())  # the error box wraps long lines


@pytest.mark.parametrize(
    ("name", "kind", "what"),
    [("config.json", "fifo", "a FIFO"), ("tokenizer.json", "fifo", "a FIFO"), ("config.json", "directory",
     "a directory"), ("chat_template.jinja", "socket", "a socket")],
)  # fmt: skip
def test_a_folder_file_that_is_no_regular_file_is_refused_by_the_cli(
    name: str, kind: str, what: str, tmp_path: Path
) -> None:
    """`mkfifo f/config.json; accelharness native --model-path f` blocked forever in read_config; a FIFO
    tokenizer.json was passed over (or, linked to, waited on), a directory named config.json was 'not a file'."""
    folder = optimum_folder(tmp_path)
    held = special(folder / name, kind)
    try:
        message = refused(folder, tmp_path)
    finally:
        if held is not None:
            held.close()
    assert f"{folder / name} is {what}, {NOT_REGULAR}" in message


def test_a_fifo_chat_template_is_refused_with_a_prompt_and_chat(tmp_path: Path) -> None:
    """The files --prompt --chat reads (tokenizer.json, chat_template.jinja): a FIFO template refused, not read."""
    folder = optimum_folder(tmp_path)
    (folder / "tokenizer.json").write_text("{}")
    special(folder / "chat_template.jinja", "fifo")
    message = refused(folder, tmp_path, "--mode", "generate", "--prompt", "hello", "--chat")
    assert f"chat_template.jinja is a FIFO, {NOT_REGULAR}" in message


def test_a_lone_graph_and_its_data_file_as_fifos_are_refused(tmp_path: Path) -> None:
    """--model-path a FIFO, and a graph whose external data file is a FIFO (ONNX Runtime would wait on it)."""
    os.mkfifo(tmp_path / "model.onnx")
    assert f"model.onnx is a FIFO, {NOT_REGULAR}" in refused(tmp_path / "model.onnx", tmp_path)
    (tmp_path / "mine").mkdir()
    graph = matmul_model(tmp_path / "mine" / "model.onnx", external=True)
    special(tmp_path / "mine" / "model.onnx.data", "fifo")
    assert f"model.onnx.data is a FIFO, {NOT_REGULAR}" in refused(graph, tmp_path)


@pytest.mark.parametrize("layout", ["transformers.js", "optimum"])
def test_a_layouts_graph_that_is_a_fifo_is_refused_not_passed_over(layout: str, tmp_path: Path) -> None:
    """onnx/model.onnx (or model.onnx) a FIFO beside a regular fp16 file: named, not skipped for another file."""
    folder = tmp_path / "f"
    where = folder / "onnx" if layout == "transformers.js" else folder
    where.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    matmul_model(where / "model_fp16.onnx")
    os.mkfifo(where / "model.onnx")
    assert f"model.onnx is a FIFO, {NOT_REGULAR}" in refused(folder, tmp_path)


@pytest.mark.parametrize("kind", ["fifo", "socket", "directory"])
def test_every_reader_of_a_folders_files_refuses_what_is_no_regular_file(kind: str, tmp_path: Path) -> None:
    """The reader itself, and each reader built on it (read_config; prompts' tokenizer, template and EOS files;
    a checkpoint's config.json), returns at once with the refusal: none waits on a FIFO."""
    from harness.prepare.prompts import PromptError, chat_text, eos_ids, load_tokenizer
    from harness.prepare.specs import SpecError, _checkpoint_spec

    names = ("config.json", "tokenizer.json", "chat_template.jinja", "generation_config.json")  # the first EOS source
    held = [special(tmp_path / name, kind) for name in names]
    try:
        with pytest.raises(FolderError, match=NOT_REGULAR):
            read_config(tmp_path, "config.json")
        with pytest.raises(FolderError, match=NOT_REGULAR):
            read_file(tmp_path, "tokenizer.json", 10, "the tokenizer file tokenizer.json", "it takes")
        for call in (lambda: load_tokenizer(tmp_path), lambda: chat_text(tmp_path, "hi"), lambda: eos_ids(tmp_path)):
            with pytest.raises(PromptError, match=NOT_REGULAR):
                call()
        with pytest.raises(SpecError, match=NOT_REGULAR):
            _checkpoint_spec(tmp_path, None)
    finally:
        for each in held:
            if each is not None:
                each.close()


def test_a_file_swapped_for_a_fifo_after_its_check_is_refused_not_waited_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A race: the name checked as a regular file, then a FIFO when opened. Opened with O_NONBLOCK and checked
    again on what was opened, it is refused at once."""
    import harness.prepare.folder_checks as folder_checks

    regular = tmp_path / "regular.json"
    regular.write_text("{}")
    os.mkfifo(tmp_path / "config.json")
    real_stat = os.stat
    monkeypatch.setattr(folder_checks.os, "stat", lambda path, *a, **k: real_stat(regular))  # the check saw a file
    with pytest.raises(FolderError, match=f"is a FIFO, {NOT_REGULAR}"):
        read_regular(tmp_path / "config.json", 100, "it takes")


def test_the_reader_bounds_a_file_before_and_while_reading_it(tmp_path: Path) -> None:
    """Over the bound by its size: refused before a byte is read; a regular file within it reads whole."""
    (tmp_path / "big.json").write_bytes(b"x" * 11)
    with pytest.raises(FolderError, match=r"big\.json is 11 bytes; it takes at most 10"):
        read_regular(tmp_path / "big.json", 10, "it takes")
    assert read_regular(tmp_path / "big.json", 11, "it takes") == b"x" * 11
    with pytest.raises(FolderError, match="cannot read"):
        read_regular(tmp_path / "absent.json", 10, "it takes")
