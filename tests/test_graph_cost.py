"""FLOPs and bytes per node from ONNX graphs with inferred shapes, against hand-computed values."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from tiny_prepared import prepared

from harness.core.graph_cost import graph_cost

F32 = 4  # bytes per float32


def save(tmp_path: Path, nodes: list, inputs: list, outputs: list, weights: dict[str, np.ndarray]) -> Path:
    graph = helper.make_graph(
        nodes, "g", inputs, outputs, [numpy_helper.from_array(w, name) for name, w in weights.items()]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    return path


def value(name: str, dims: list) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)


def test_matmul_with_symbolic_dims_fixed_by_the_case(tmp_path: Path) -> None:
    """x[batch, seq, 16] @ W[16, 32]: 2·K·(outputs) = 2·16·(2·7·32) FLOPs at batch 2, seq 7."""
    weight = np.ones((16, 32), np.float32)
    path = save(
        tmp_path,
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [value("x", ["batch", "seq", 16])],
        [value("y", ["batch", "seq", 32])],
        {"w": weight},
    )
    node = graph_cost(path, {"x": (2, 7, 16)}).by_name()["mm"]
    assert node.flops == 2 * 16 * (2 * 7 * 32) == 14336
    assert node.bytes == (2 * 7 * 16 + 16 * 32 + 2 * 7 * 32) * F32
    assert node.weighted and node.op_class == "matmul"
    # The same graph at another case counts that case's shapes.
    assert graph_cost(path, {"x": (1, 3, 16)}).by_name()["mm"].flops == 2 * 16 * (3 * 32)


def test_activation_matmul_is_not_a_linear_layer(tmp_path: Path) -> None:
    """q[2, 4, 8, 16] @ kᵀ[2, 4, 16, 8] (attention scores): batched, both operands activations."""
    path = save(
        tmp_path,
        [
            helper.make_node("Transpose", ["k"], ["kt"], name="t", perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
        ],
        [value("q", [2, 4, 8, 16]), value("k", [2, 4, 8, 16])],
        [value("s", [2, 4, 8, 8])],
        {},
    )
    nodes = graph_cost(path, {}).by_name()
    assert nodes["scores"].flops == 2 * 16 * (2 * 4 * 8 * 8)
    assert not nodes["scores"].weighted and nodes["scores"].op_class == "matmul_act"
    assert nodes["t"].flops == 0 and nodes["t"].bytes == 2 * (2 * 4 * 8 * 16) * F32  # moved, not computed


def test_gemm_with_transposed_weight_and_bias(tmp_path: Path) -> None:
    """A[3, 4] · B[5, 4]ᵀ + C[5]: 2·3·4·5 multiply-adds plus one bias add per output (15)."""
    path = save(
        tmp_path,
        [helper.make_node("Gemm", ["a", "b", "c"], ["y"], name="gemm", transB=1)],
        [value("a", [3, 4])],
        [value("y", [3, 5])],
        {"b": np.ones((5, 4), np.float32), "c": np.ones(5, np.float32)},
    )
    node = graph_cost(path, {}).by_name()["gemm"]
    assert node.flops == 2 * 3 * 4 * 5 + 3 * 5 == 135
    assert node.bytes == (12 + 20 + 5 + 15) * F32


def test_conv_padded_grouped_and_with_bias(tmp_path: Path) -> None:
    """Conv X[1, 3, 8, 8] * W[16, 3, 3, 3], pad 1, bias: 2·27 per output element of Y[1, 16, 8, 8]
    plus its bias; a depthwise (group 16) Conv on Y, no pad: 2·9 per output element of [1, 16, 6, 6]."""
    path = save(
        tmp_path,
        [
            helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("Conv", ["y", "dw"], ["z"], name="depthwise", group=16),
        ],
        [value("x", [1, 3, 8, 8])],
        [value("z", [1, 16, 6, 6])],
        {
            "w": np.ones((16, 3, 3, 3), np.float32),
            "b": np.ones(16, np.float32),
            "dw": np.ones((16, 1, 3, 3), np.float32),
        },
    )
    nodes = graph_cost(path, {}).by_name()
    assert nodes["conv"].flops == 2 * (16 * 8 * 8) * (3 * 3 * 3) + 16 * 8 * 8 == 56320
    assert nodes["depthwise"].flops == 2 * (16 * 6 * 6) * 9 == 10368
    assert nodes["conv"].bytes == (3 * 64 + 16 * 27 + 16 + 16 * 64) * F32
    assert nodes["conv"].op_class == nodes["depthwise"].op_class == "conv"


def test_elementwise_softmax_and_unknown_ops(tmp_path: Path) -> None:
    """An Add counts one operation per output element, Softmax five per element; an op without a
    rule gets no count rather than a guess, but its bytes are still known."""
    path = save(
        tmp_path,
        [
            helper.make_node("Add", ["x", "x"], ["a"], name="add"),
            helper.make_node("Softmax", ["a"], ["s"], name="softmax", axis=-1),
            helper.make_node("Det", ["s"], ["d"], name="det"),
        ],
        [value("x", [2, 3, 3])],
        [helper.make_tensor_value_info("d", TensorProto.FLOAT, [2])],
        {},
    )
    nodes = graph_cost(path, {}).by_name()
    assert nodes["add"].flops == 18 and nodes["softmax"].flops == 5 * 18
    assert nodes["det"].flops is None and nodes["det"].bytes == (18 + 2) * F32
    assert nodes["det"].op_class == "other"


def test_unknown_input_shape_is_not_counted(tmp_path: Path) -> None:
    """Without the case's shapes a symbolic dimension stays unknown: no FLOPs, no bytes, and the
    graph says how many nodes it could not count."""
    path = save(
        tmp_path,
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        [value("x", ["batch", 16])],
        [value("y", ["batch", 32])],
        {"w": np.ones((16, 32), np.float32)},
    )
    cost = graph_cost(path, {})
    assert cost.by_name()["mm"].flops is None and cost.by_name()["mm"].bytes is None
    assert cost.unknown_shapes == 1


@pytest.mark.parametrize("batch, seq", [(1, 8), (2, 16)])
def test_exported_bert_tiny_linear_layers(bert_tiny_export: Path, batch: int, seq: int) -> None:
    """A real dynamo export: every shape is inferred (onnx's inference leaves the mask's Range/Expand
    to ONNX Runtime's symbolic inference), and the linear layers' FLOPs are 2 × tokens × their
    weights: 2 layers × (4 attention projections 128×128 + 128×512 + 512×128)."""
    inputs = {name: (batch, seq) for name in ("input_ids", "attention_mask", "token_type_ids")}
    cost = graph_cost(bert_tiny_export, inputs)
    assert cost.unknown_shapes == 0
    linear = sum(n.flops or 0 for n in cost.nodes if n.op_class == "matmul")
    assert linear == 2 * batch * seq * 2 * (4 * 128 * 128 + 2 * 128 * 512)
    work = cost.work_by_class()  # what the operator predictor prices: [FLOPs, bytes, nodes] per class
    assert work["matmul"][0] == linear and work["matmul"][2] == 2 * 6  # 6 weight MatMuls per layer
    assert sum(w[2] for w in work.values()) == len(cost.nodes)
    attention = sum(n.flops or 0 for n in cost.nodes if n.op_class == "matmul_act")
    assert attention == 2 * 2 * (2 * batch * 2 * seq * seq * 64)  # layers × (QKᵀ, AV) × 2·b·heads·s²·d


def test_a_graph_with_external_weights_is_counted_as_the_same_graph_inline(
    bert_tiny_export: Path, tmp_path: Path
) -> None:
    """bert-tiny saved with its weights in a side file (as a larger export is: MiniLM, bert-base) counts the same
    FLOPs and bytes per item: ONNX Runtime's symbolic inference once read a weight's data to propagate it, failed on
    the file it could not open, and left every such model without FLOPs; and an inference row's bytes need the
    outputs' shapes that only that inference gives (onnx's alone left them unknown on every export)."""
    from harness.core.graph_cost import inference_work

    inputs = {name: (1, 8) for name in ("input_ids", "attention_mask", "token_type_ids")}
    inline = inference_work(bert_tiny_export, inputs, 1)[0]
    side = tmp_path / "model.onnx"
    onnx.save(
        onnx.load(str(bert_tiny_export)), side, save_as_external_data=True
    )  # small tensors inline, as in an export
    assert any(
        t.data_location == TensorProto.EXTERNAL
        for t in onnx.load(str(side), load_external_data=False).graph.initializer
    )
    assert inline["flops_per_item"] and inline["bytes_per_item"]
    assert inference_work(side, inputs, 1)[0] == inline
    assert graph_cost(side, inputs).unknown_shapes == 0


@pytest.fixture(scope="module")
def bert_tiny_export() -> Path:
    export = prepared("bert-tiny").onnx_path
    assert export is not None
    return export


def test_a_rows_count_is_remembered_per_file_content_and_recounted_when_either_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """harness.prepare.work_memo: the same file at the same case is counted once; an edited file, another case
    or a damaged entry is counted afresh (never trusted)."""
    import harness.run.ceilings as ceilings
    from harness.core.records import Case
    from harness.prepare import work_memo
    from harness.prepare.work_memo import MEMO_DIR

    monkeypatch.setenv("ACCELHARNESS_CACHE_DIR", str(tmp_path / "cache"))
    weight = np.ones((16, 32), np.float32)
    path = save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
                [value("x", ["batch", 16])], [value("y", ["batch", 32])], {"w": weight})  # fmt: skip
    counts: list[Case] = []
    real_count = ceilings._count

    def counting(model: Path, case: Case, shapes: dict) -> tuple:
        counts.append(case)
        return real_count(model, case, shapes)

    monkeypatch.setattr(ceilings, "_count", counting)
    case = Case(batch_size=2, seq_len=None, precision="fp32")
    first = ceilings.row_work(path, case, {"x": [2, 16]})
    assert first[0]["flops_per_item"] == 2 * 16 * 32 and len(counts) == 1
    assert first[1]["work_source"] == work_memo.COUNTED_NOW
    again = ceilings.row_work(path, case, {"x": [2, 16]})
    assert again[0] == first[0] and len(counts) == 1  # remembered, and the row says so
    assert again[1] == first[1] | {"work_source": work_memo.FROM_MEMO}
    ceilings.row_work(path, Case(batch_size=4, seq_len=None, precision="fp32"), {"x": [4, 16]})
    assert len(counts) == 2  # another workload
    assert len(list((tmp_path / "cache" / MEMO_DIR).glob("*.json"))) == 2
    for damaged in (b"[1, 2", b'"not a pair"', b"x" * (2 << 20)):
        for memo in (tmp_path / "cache" / MEMO_DIR).glob("*.json"):
            memo.write_bytes(damaged)
        fields, facts = ceilings.row_work(path, case, {"x": [2, 16]})  # recounted, the same answer, and said
        assert fields == first[0] and facts == first[1] | {"work_source": work_memo.COUNTED_OVER_ENTRY}
    before = len(counts)
    save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
         [value("x", ["batch", 16])], [value("y", ["batch", 64])], {"w": np.ones((16, 64), np.float32)})  # fmt: skip
    assert ceilings.row_work(path, case, {"x": [2, 16]})[0]["flops_per_item"] == 2 * 16 * 64
    assert len(counts) == before + 1  # the file's bytes changed: counted afresh


def test_onnx_runtimes_symbolic_inference_loads_without_torch() -> None:
    """onnxruntime.tools' __init__ imports torch when installed: the counting worker loads the one file instead."""
    import subprocess
    import sys

    code = ("import sys; from harness.core.graph_cost import _symbolic_shape_inference as s; "
            "assert s().__name__ == 'SymbolicShapeInference'; print('torch' in sys.modules)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
