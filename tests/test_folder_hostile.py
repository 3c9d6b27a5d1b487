"""Issue 30 item 11, the layouts that need no builder: a transformers.js or optimum folder, a checkpoint's
config.json and a lone .onnx file, each corrupted as someone else's folder could be, refused before a run exists
(exit 2 naming the key or the file, no store written, no traceback). The onnxruntime-genai folder's refusals
use its builder's real output: tests/test_model_folders.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import onnx
import pytest
from conftest import run_cli_process
from int4_models import matmul_model

NATIVE = ("native", "--hardware", "cpu", "--engines", "onnxruntime", "--batch-sizes", "1", "--iterations", "1",
          "--warmup", "0", "--min-duration", "0")  # fmt: skip


def refused(model_path: Path, tmp_path: Path) -> str:
    """The CLI's stderr for a native run of the model path, which must be refused: exit 2, no traceback,
    nothing written to the store."""
    db = tmp_path / "refused.duckdb"
    done = run_cli_process(*NATIVE, "--model-path", str(model_path), "--db", str(db), cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "\x1b[31m" not in done.stderr
    assert not db.exists()
    return " ".join(done.stderr.split())  # the error box wraps long lines


def layout(root: Path, kind: str, config: dict | None = None) -> Path:
    """A transformers.js (onnx/model.onnx) or optimum (model.onnx) folder of a tiny MatMul graph whose weights
    are in external data, with a config.json."""
    folder = root / kind
    graph_dir = folder / "onnx" if kind == "transformers.js" else folder
    graph_dir.mkdir(parents=True)
    matmul_model(graph_dir / "model.onnx", external=True)
    (folder / "config.json").write_text(json.dumps(config or {"model_type": "llama", "num_hidden_layers": 2}))
    return folder


def relocate_external_data(graph: Path, location: str) -> None:
    """Point every external tensor of the graph at `location` (the weights stay where they were)."""
    model = onnx.load(str(graph), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save(model, str(graph))


@pytest.mark.parametrize("kind", ["transformers.js", "optimum"])
def test_a_layout_file_that_is_a_symlink_leading_out_is_refused(kind: str, tmp_path: Path) -> None:
    folder = layout(tmp_path, kind)
    outside = matmul_model(tmp_path / "elsewhere.onnx")
    graph = folder / "onnx" / "model.onnx" if kind == "transformers.js" else folder / "model.onnx"
    graph.unlink()
    os.symlink(outside, graph)
    message = refused(folder, tmp_path)
    assert "the layout's model file" in message and f"resolves to {outside}, outside the model folder" in message


def test_a_config_json_symlink_leading_out_is_refused(tmp_path: Path) -> None:
    folder = layout(tmp_path, "optimum")
    (tmp_path / "elsewhere.json").write_text(json.dumps({"model_type": "llama"}))
    (folder / "config.json").unlink()
    os.symlink(tmp_path / "elsewhere.json", folder / "config.json")
    assert "the config file config.json names 'config.json', which resolves to" in refused(folder, tmp_path)


@pytest.mark.parametrize("location", ["../../model.onnx.data", "ABSOLUTE"])
def test_external_data_located_outside_the_folder_is_refused_by_name(location: str, tmp_path: Path) -> None:
    """A layout's graph (onnx/model.onnx) whose external data location leads out of the folder, by ../ or an
    absolute path: refused naming the tensor."""
    folder = layout(tmp_path, "transformers.js")
    graph = folder / "onnx" / "model.onnx"
    (graph.parent / "model.onnx.data").rename(tmp_path / "model.onnx.data")  # where it leads, so it would load
    relocate_external_data(graph, str(tmp_path / "model.onnx.data") if location == "ABSOLUTE" else location)
    message = refused(folder, tmp_path)
    assert "model.onnx: tensor 'w0': external data location names" in message
    assert "outside the model folder" in message


def test_a_lone_files_external_data_stays_beside_it(tmp_path: Path) -> None:
    """--model-path model.onnx whose weights are a symlink leading out of its folder."""
    (tmp_path / "mine").mkdir()
    graph = matmul_model(tmp_path / "mine" / "model.onnx", external=True)
    (tmp_path / "mine" / "model.onnx.data").rename(tmp_path / "theirs.data")
    os.symlink(tmp_path / "theirs.data", tmp_path / "mine" / "model.onnx.data")
    message = refused(graph, tmp_path)
    assert "tensor 'w0': external data location names 'model.onnx.data'" in message


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"num_hidden_layers": 10**9}, "config.json key 'num_hidden_layers' takes a whole number from 0 to 1,024"),
        ({"text_config": {"vocab_size": 10**12}}, "key 'text_config.vocab_size' takes a whole number from 0 to"),
        ({"hidden_size": "big"}, "config.json key 'hidden_size' must be an integer, got string \"big\""),
        ({"num_attention_heads": True}, "key 'num_attention_heads' must be an integer, got boolean true"),
    ],
)
def test_a_layouts_config_sizes_are_typed_and_bounded(config: dict, expected: str, tmp_path: Path) -> None:
    folder = layout(tmp_path, "optimum", {"model_type": "llama"} | config)
    assert expected in refused(folder, tmp_path)


def test_a_checkpoints_sizes_are_bounded_before_a_model_is_built(tmp_path: Path) -> None:
    """A Hugging Face checkpoint folder (config.json only): 10^9 layers refused, not built in the worker."""
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", "num_hidden_layers": 10**9}))
    assert "config.json key 'num_hidden_layers' takes a whole number from 0 to 1,024" in refused(folder, tmp_path)


def test_an_oversized_config_is_refused_before_it_is_read(tmp_path: Path) -> None:
    from harness.core.bounds import MAX_CONFIG_BYTES

    folder = layout(tmp_path, "optimum")
    with (folder / "config.json").open("r+b") as config:
        config.truncate(MAX_CONFIG_BYTES + 1)  # sparse: the bound is read from its size alone
    assert f"a model folder's config takes at most {MAX_CONFIG_BYTES:,}" in refused(folder, tmp_path)
