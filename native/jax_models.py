"""Flax NNX definitions of transformers' ResNetModel and ViTModel, and the torch → JAX weight port.

transformers 5 ships no Flax models, so these are compact re-implementations of the two torch
modules, written to compute the same function. Attribute names mirror transformers' module
names, so each torch state_dict key names the NNX variable it fills
(`encoder.stages.0.layers.1.layer.2.convolution.weight` → `encoder/stages/0/layers/1/layer/2/
convolution/kernel`). The port is one loop with a strict check that every NNX variable was
filled, so a rename in transformers fails loudly instead of leaving random weights behind.

Activations run channels-last (NHWC, what flax's Conv and BatchNorm expect); inputs arrive
NCHW as the harness makes them, and outputs leave in the torch module's layout.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from harness.native.base import UnsupportedError

# transformers' ACT2FN names → JAX functions. "gelu" there is the exact (erf) form; the *_new,
# *_pytorch_tanh and *_fast variants are the tanh approximation.
ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu,
    "gelu": partial(jax.nn.gelu, approximate=False),
    "gelu_new": partial(jax.nn.gelu, approximate=True),
    "gelu_pytorch_tanh": partial(jax.nn.gelu, approximate=True),
    "gelu_fast": partial(jax.nn.gelu, approximate=True),
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "silu": jax.nn.silu,
    "swish": jax.nn.silu,
}
TORCH_BATCHNORM_EPS = 1e-5  # nn.BatchNorm2d's default, which transformers' ResNet keeps


def _activation(name: str) -> str:
    """Validate an activation name at construction time, so a model is rejected at load."""
    if name not in ACTIVATIONS:
        raise UnsupportedError(f"jax engine has no '{name}' activation (known: {', '.join(ACTIVATIONS)})")
    return name


# ---- ResNet (transformers.ResNetModel) ---------------------------------------------------------


class ConvLayer(nnx.Module):
    """ResNetConvLayer: conv (no bias, padding k//2) → BatchNorm with running stats → activation."""

    def __init__(
        self, cin: int, cout: int, kernel: int = 3, stride: int = 1, activation: str | None = "relu", *, rngs: nnx.Rngs
    ) -> None:
        pad = kernel // 2
        self.convolution = nnx.Conv(
            cin, cout, (kernel, kernel), (stride, stride), padding=((pad, pad), (pad, pad)), use_bias=False, rngs=rngs
        )
        self.normalization = nnx.BatchNorm(cout, use_running_average=True, epsilon=TORCH_BATCHNORM_EPS, rngs=rngs)
        self.activation = _activation(activation) if activation else None

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.normalization(self.convolution(x))
        return ACTIVATIONS[self.activation](x) if self.activation else x


class ShortCut(nnx.Module):
    """ResNetShortCut: a strided 1x1 conv + BatchNorm projecting the residual to the new shape."""

    def __init__(self, cin: int, cout: int, stride: int, *, rngs: nnx.Rngs) -> None:
        self.convolution = nnx.Conv(cin, cout, (1, 1), (stride, stride), padding="VALID", use_bias=False, rngs=rngs)
        self.normalization = nnx.BatchNorm(cout, use_running_average=True, epsilon=TORCH_BATCHNORM_EPS, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.normalization(self.convolution(x))


class ResidualLayer(nnx.Module):
    """ResNetBasicLayer (3x3 → 3x3) or ResNetBottleNeckLayer (1x1 reduce → 3x3 → 1x1 expand).

    As in transformers, the inner convolutions use relu whatever config.hidden_act says; only
    the activation after the residual sum is config.hidden_act.
    """

    def __init__(self, cin: int, cout: int, stride: int, config: Any, *, rngs: nnx.Rngs) -> None:
        self.shortcut = ShortCut(cin, cout, stride, rngs=rngs) if cin != cout or stride != 1 else None
        if config.layer_type == "bottleneck":
            mid, first = cout // 4, config.downsample_in_bottleneck
            convs = [
                ConvLayer(cin, mid, 1, stride if first else 1, rngs=rngs),
                ConvLayer(mid, mid, 3, 1 if first else stride, rngs=rngs),
                ConvLayer(mid, cout, 1, 1, None, rngs=rngs),
            ]
        else:
            convs = [ConvLayer(cin, cout, 3, stride, rngs=rngs), ConvLayer(cout, cout, 3, 1, None, rngs=rngs)]
        self.layer = nnx.List(convs)
        self.activation = _activation(config.hidden_act)

    def __call__(self, x: jax.Array) -> jax.Array:
        residual = self.shortcut(x) if self.shortcut is not None else x
        for conv in self.layer:
            x = conv(x)
        return ACTIVATIONS[self.activation](x + residual)


class Stage(nnx.Module):
    """ResNetStage: `depth` residual layers, the first changing channels and stride."""

    def __init__(self, cin: int, cout: int, stride: int, depth: int, config: Any, *, rngs: nnx.Rngs) -> None:
        layers = [ResidualLayer(cin, cout, stride, config, rngs=rngs)]
        layers += [ResidualLayer(cout, cout, 1, config, rngs=rngs) for _ in range(depth - 1)]
        self.layers = nnx.List(layers)

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = layer(x)
        return x


class Encoder(nnx.Module):
    def __init__(self, config: Any, *, rngs: nnx.Rngs) -> None:
        channels = [config.embedding_size, *config.hidden_sizes]
        strides = [2 if config.downsample_in_first_stage else 1] + [2] * (len(config.hidden_sizes) - 1)
        self.stages = nnx.List(
            [
                Stage(cin, cout, stride, depth, config, rngs=rngs)
                for cin, cout, stride, depth in zip(channels[:-1], channels[1:], strides, config.depths, strict=True)
            ]
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        for stage in self.stages:
            x = stage(x)
        return x


class Embedder(nnx.Module):
    """ResNetEmbeddings: a 7x7 stride-2 conv layer, then a 3x3 stride-2 max pool (padding 1)."""

    def __init__(self, config: Any, *, rngs: nnx.Rngs) -> None:
        self.embedder = ConvLayer(config.num_channels, config.embedding_size, 7, 2, config.hidden_act, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.embedder(x)
        # torch's MaxPool2d pads with -inf, so padding never wins the max.
        padding = ((0, 0), (1, 1), (1, 1), (0, 0))
        return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 3, 3, 1), (1, 2, 2, 1), padding)


class ResNet(nnx.Module):
    """transformers.ResNetModel: last_hidden_state (B, C, H, W) and pooler_output (B, C, 1, 1)."""

    def __init__(self, config: Any, *, rngs: nnx.Rngs) -> None:
        self.embedder = Embedder(config, rngs=rngs)
        self.encoder = Encoder(config, rngs=rngs)

    def __call__(self, pixel_values: jax.Array) -> dict[str, jax.Array]:
        hidden = self.encoder(self.embedder(jnp.transpose(pixel_values, (0, 2, 3, 1))))
        pooled = jnp.mean(hidden, axis=(1, 2), keepdims=True)  # AdaptiveAvgPool2d((1, 1))
        return {
            "last_hidden_state": jnp.transpose(hidden, (0, 3, 1, 2)),
            "pooler_output": jnp.transpose(pooled, (0, 3, 1, 2)),
        }


# ---- ViT (transformers.ViTModel) ---------------------------------------------------------------


class PatchEmbeddings(nnx.Module):
    def __init__(self, config: Any, *, rngs: nnx.Rngs) -> None:
        patch = (config.patch_size, config.patch_size)
        self.projection = nnx.Conv(config.num_channels, config.hidden_size, patch, patch, padding="VALID", rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = self.projection(x)  # (B, H/p, W/p, D): row-major patches, as torch's flatten(2)
        return x.reshape(x.shape[0], -1, x.shape[-1])


class Embeddings(nnx.Module):
    """ViTEmbeddings without interpolation or masking: [CLS] + patches, plus position embeddings."""

    def __init__(self, config: Any, *, rngs: nnx.Rngs) -> None:
        patches = (config.image_size // config.patch_size) ** 2
        self.cls_token = nnx.Param(jnp.zeros((1, 1, config.hidden_size)))
        self.position_embeddings = nnx.Param(jnp.zeros((1, patches + 1, config.hidden_size)))
        self.patch_embeddings = PatchEmbeddings(config, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        patches = self.patch_embeddings(x)
        cls = jnp.broadcast_to(self.cls_token[...].astype(patches.dtype), (x.shape[0], 1, patches.shape[-1]))
        return jnp.concatenate([cls, patches], axis=1) + self.position_embeddings[...].astype(patches.dtype)


class Attention(nnx.Module):
    """ViTAttention: bidirectional multi-head self-attention, softmax in fp32 as transformers does."""

    def __init__(self, config: Any, *, rngs: nnx.Rngs) -> None:
        width, heads = config.hidden_size, config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or width // heads
        inner = heads * self.head_dim
        self.q_proj = nnx.Linear(width, inner, use_bias=config.qkv_bias, rngs=rngs)
        self.k_proj = nnx.Linear(width, inner, use_bias=config.qkv_bias, rngs=rngs)
        self.v_proj = nnx.Linear(width, inner, use_bias=config.qkv_bias, rngs=rngs)
        self.o_proj = nnx.Linear(inner, width, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        split = (*x.shape[:-1], -1, self.head_dim)  # (B, N, heads, head_dim)
        q, k, v = (proj(x).reshape(split) for proj in (self.q_proj, self.k_proj, self.v_proj))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * self.head_dim**-0.5
        weights = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(q.dtype)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v)
        return self.o_proj(out.reshape(*x.shape[:-1], -1))


class Mlp(nnx.Module):
    def __init__(self, config: Any, *, rngs: nnx.Rngs) -> None:
        self.fc1 = nnx.Linear(config.hidden_size, config.intermediate_size, rngs=rngs)
        self.fc2 = nnx.Linear(config.intermediate_size, config.hidden_size, rngs=rngs)
        self.activation = _activation(config.hidden_act)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(ACTIVATIONS[self.activation](self.fc1(x)))


def _layer_norm(config: Any, rngs: nnx.Rngs) -> nnx.LayerNorm:
    # Two-pass variance (E[(x-mean)²]) as torch computes it; flax's fast E[x²]-mean² loses digits.
    return nnx.LayerNorm(config.hidden_size, epsilon=config.layer_norm_eps, use_fast_variance=False, rngs=rngs)


class Layer(nnx.Module):
    """ViTLayer: pre-norm attention and MLP blocks, each with a residual connection."""

    def __init__(self, config: Any, *, rngs: nnx.Rngs) -> None:
        self.attention = Attention(config, rngs=rngs)
        self.layernorm_before = _layer_norm(config, rngs)
        self.layernorm_after = _layer_norm(config, rngs)
        self.mlp = Mlp(config, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attention(self.layernorm_before(x))
        return x + self.mlp(self.layernorm_after(x))


class ViT(nnx.Module):
    """transformers.ViTModel's last_hidden_state (B, 1 + patches, D); its pooler is not ported."""

    def __init__(self, config: Any, *, rngs: nnx.Rngs) -> None:
        self.embeddings = Embeddings(config, rngs=rngs)
        self.layers = nnx.List([Layer(config, rngs=rngs) for _ in range(config.num_hidden_layers)])
        self.layernorm = _layer_norm(config, rngs)

    def __call__(self, pixel_values: jax.Array) -> dict[str, jax.Array]:
        x = self.embeddings(jnp.transpose(pixel_values, (0, 2, 3, 1)))
        for layer in self.layers:
            x = layer(x)
        return {"last_hidden_state": self.layernorm(x)}


# ---- building and porting -----------------------------------------------------------------------

# spec architecture → (NNX class, the outputs it computes)
ARCHITECTURES: dict[str, tuple[type[nnx.Module], tuple[str, ...]]] = {
    "ResNetModel": (ResNet, ("last_hidden_state", "pooler_output")),
    "ViTModel": (ViT, ("last_hidden_state",)),
}

# NNX variable name → (torch parameter or buffer name); kernels are transposed on the way.
TORCH_NAMES = {"kernel": "weight", "scale": "weight", "bias": "bias", "mean": "running_mean", "var": "running_var"}


def build_abstract(architecture: str, config: Any) -> nnx.Module:
    """The NNX model with shapes only (nnx.eval_shape): no random init of weights that the port
    overwrites anyway, which for ViT-B/16 would be 86M parameters drawn for nothing."""
    model_class, _ = ARCHITECTURES[architecture]
    return nnx.eval_shape(lambda: model_class(config, rngs=nnx.Rngs(0)))


def _torch_key(path: tuple[Any, ...]) -> str:
    *module, name = (str(p) for p in path)
    return ".".join([*module, TORCH_NAMES.get(name, name)])


def _to_jax_layout(name: str, array: np.ndarray) -> np.ndarray:
    """torch Conv2d weights are (out, in, h, w), flax's (h, w, in, out); Linear weights are
    (out, in), flax's (in, out). Everything else (biases, norms, embeddings) keeps its shape."""
    if name == "kernel" and array.ndim == 4:
        return array.transpose(2, 3, 1, 0)
    if name == "kernel" and array.ndim == 2:
        return array.T
    return array


def port_torch_weights(model: nnx.Module, state_dict: Mapping[str, Any]) -> list[str]:
    """Fill every variable of an (abstract) NNX model from a torch state_dict, in place.

    Returns the torch keys left unused (ViTModel's pooler, BatchNorm's num_batches_tracked).
    Raises RuntimeError naming the first variable without a torch counterpart or of the wrong shape.
    """
    used: set[str] = set()
    for path, node in list(nnx.iter_graph(model)):
        if not isinstance(node, nnx.Variable):
            continue
        key = _torch_key(path)
        if key not in state_dict:
            raise RuntimeError(f"no torch weight '{key}' for the JAX variable {'/'.join(map(str, path))}")
        array = _to_jax_layout(str(path[-1]), state_dict[key].detach().float().cpu().numpy())
        expected = tuple(node.get_value().shape)
        if array.shape != expected:
            raise RuntimeError(f"torch weight '{key}' has shape {array.shape} in JAX layout, JAX wants {expected}")
        node.set_value(jnp.asarray(array, dtype=jnp.float32))
        used.add(key)
    return sorted(set(state_dict) - used)
