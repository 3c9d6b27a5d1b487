"""A tiny model prepared once per test session (exported, its cases written) for tests that need
the real ONNX file and inputs without going through the CLI."""

from __future__ import annotations

import functools

from harness.prepare.prepared import PreparedModel, PrepareJob, prepare_model
from harness.prepare.specs import load_specs

SHAPES = ((1, 8), (2, 16))


@functools.cache
def prepared(name: str = "bert-tiny") -> PreparedModel:
    """The model's export and its SHAPES cases, in the session's cache directory (tests/conftest.py)."""
    return next(prepare_model(PrepareJob(load_specs()[name], list(SHAPES))))
