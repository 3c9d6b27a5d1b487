"""The operator vocabulary: which ONNX op types are what kind of work, and the classes the operator
predictor and the reports group operators into, for ONNX op types and for what engines call them
(OpenVINO layer types, aten ops)."""

from __future__ import annotations

# The classes: linear-layer matmuls (a constant operand), activation x activation matmuls (attention),
# convolutions, normalisations, softmax, elementwise and reductions, data movement, and the rest.
CLASSES = ("matmul", "matmul_act", "conv", "norm", "softmax", "elementwise", "data", "other")

# Two inputs' product, 2 FLOPs per multiply-add.
MATMULS = frozenset({"MatMul", "MatMulInteger", "QLinearMatMul", "Gemm", "FusedMatMul"})
CONVS = frozenset({"Conv", "ConvInteger", "QLinearConv", "ConvTranspose", "FusedConv", "NhwcConv"})
NORMS = frozenset({
    "LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization",
    "InstanceNormalization", "GroupNormalization", "BatchNormalization", "MeanVarianceNormalization",
})  # fmt: skip
SOFTMAXES = frozenset({"Softmax", "LogSoftmax"})
# One operation per output element.
ELEMENTWISE = frozenset([
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Exp", "Log", "Erf", "Tanh", "Sigmoid", "Relu",
    "LeakyRelu", "Elu", "Selu", "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "HardSigmoid", "HardSwish", "Mish",
    "Softplus", "Softsign", "Neg", "Abs", "Max", "Min", "Mean", "Sum", "Where", "Clip", "Equal", "Less", "Greater",
    "LessOrEqual", "GreaterOrEqual", "And", "Or", "Not", "Xor", "IsNaN", "IsInf", "Sign", "Floor", "Ceil", "Round",
    "Cos", "Sin", "Tan", "Mod", "PRelu", "BitShift", "Resize", "Upsample", "Trilu", "CumSum", "Dropout",
])  # fmt: skip
# One operation per input element.
REDUCTIONS = frozenset([
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare",
    "ReduceLogSumExp", "ArgMax", "ArgMin", "GlobalAveragePool", "GlobalMaxPool", "TopK",
])  # fmt: skip
POOLS = frozenset({"MaxPool", "AveragePool", "LpPool"})
# Data movement and shape arithmetic: no FLOPs, only bytes.
MOVES = frozenset([
    "Shape", "Size", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Transpose", "Concat", "Split",
    "Slice", "Gather", "GatherElements", "GatherND", "ScatterND", "ScatterElements", "Expand", "Tile", "Pad", "Cast",
    "CastLike", "Constant", "ConstantOfShape", "Range", "DepthToSpace", "SpaceToDepth", "OneHot", "NonZero",
    "EyeLike",
])  # fmt: skip


def op_class(op_type: str, weighted: bool) -> str:
    """The class an ONNX op type belongs to, as the operator predictor groups costs."""
    if op_type in MATMULS:
        return "matmul" if weighted else "matmul_act"
    if op_type in CONVS:
        return "conv"
    if op_type in NORMS:
        return "norm"
    if op_type in SOFTMAXES:
        return "softmax"
    if op_type in ELEMENTWISE or op_type in REDUCTIONS or op_type in POOLS:
        return "elementwise"
    if op_type in MOVES:
        return "data"
    return "other"


# OpenVINO layer types (its runtime model's names), by class.
OPENVINO_CLASSES = {
    "matmul": ("FullyConnected", "FullyConnectedCompressed", "Gemm"),
    "matmul_act": ("MatMul", "ScaledDotProductAttention", "ScaledDotProductAttentionWithKVCache", "SDPA"),
    "conv": ("Convolution", "GroupConvolution", "Deconvolution", "BinaryConvolution", "ConvolutionBackpropData"),
    "norm": ("MVN", "NormalizeL2", "RMS", "BatchNormInference"),
    "softmax": ("Softmax", "LogSoftmax", "SoftMax"),
    "elementwise": ("Eltwise", "Subgraph", "Math", "Reduce", "Pooling", "Interpolate", "Select", "Power"),
    "data": (
        "Reorder", "Reshape", "Transpose", "Concatenation", "Gather", "StridedSlice", "ShapeOf", "Convert",
        "Broadcast", "Split", "Tile", "Pad", "Input", "Output", "Parameter", "Result", "Const", "Range",
        "ScatterUpdate", "Squeeze", "Unsqueeze", "Slice", "GatherND",
    ),
}  # fmt: skip
# aten ops (torch.profiler rows): exact names, then name prefixes for families of kernels.
ATEN_CLASSES = {
    "matmul": ("aten::addmm", "aten::mm", "aten::linear", "aten::_addmm_activation"),
    "matmul_act": ("aten::bmm", "aten::baddbmm", "aten::matmul"),
    "conv": ("aten::convolution", "aten::_convolution", "aten::mkldnn_convolution", "aten::conv2d", "aten::conv1d"),
    "norm": ("aten::native_layer_norm", "aten::layer_norm", "aten::batch_norm", "aten::native_batch_norm"),
    "softmax": ("aten::_softmax", "aten::softmax", "aten::_log_softmax"),
    "data": (
        "aten::view", "aten::reshape", "aten::transpose", "aten::permute", "aten::contiguous", "aten::copy_",
        "aten::clone", "aten::cat", "aten::index_select", "aten::embedding", "aten::slice", "aten::select",
        "aten::expand", "aten::unsqueeze", "aten::squeeze", "aten::to", "aten::_to_copy", "aten::empty",
        "aten::as_strided", "aten::t", "aten::split", "aten::chunk", "aten::index", "aten::_unsafe_view",
        "aten::empty_like", "aten::zeros", "aten::ones", "aten::full", "aten::arange", "aten::detach",
    ),
}  # fmt: skip
ATEN_PREFIXES = {"aten::_scaled_dot_product": "matmul_act", "aten::_nnpack": "conv", "aten::slow_conv": "conv"}


def executed_class(op_type: str) -> str:
    """The class of an operator as an engine names it, when no ONNX node stands behind it."""
    if op_type.startswith("aten::"):
        exact = next((name for name, ops in ATEN_CLASSES.items() if op_type in ops), None)
        prefixed = next((name for prefix, name in ATEN_PREFIXES.items() if op_type.startswith(prefix)), None)
        return exact or prefixed or "elementwise"
    onnx_class = op_class(op_type, weighted=True)  # an ONNX or ORT contrib op type that no graph node matched
    if onnx_class != "other":
        return onnx_class
    return next((name for name, types in OPENVINO_CLASSES.items() if op_type in types), "other")
