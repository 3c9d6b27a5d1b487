"""Which weights a spec's module is built with (pretrained, found offline, or seeded random) and
their fingerprint, the part of an export's cache key they decide. Torch-free: a run whose export is
cached decides it is (harness.prepare.prepared.needs_torch) without importing torch.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from harness.prepare.specs import ModelSpec

WEIGHT_SEED = 0
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")


@dataclass(frozen=True)
class Weights:
    kind: str  # "pretrained" | "random"
    source: str  # directory the weights came from, or the seed used
    fingerprint: str  # changes whenever the weights would change


def _weights_fingerprint(directory: Path) -> str:
    parts = [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sorted(directory.iterdir())]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def package_directory(spec: ModelSpec) -> Path | None:
    """The weights directory inside the spec's pretrained_package, if that package is installed.

    find_spec locates the package without importing (running) it.
    """
    if not spec.pretrained_package:
        return None
    try:
        found = importlib.util.find_spec(spec.pretrained_package)
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    directory = Path(next(iter(found.submodule_search_locations))) / spec.pretrained_package_path
    return directory if directory.is_dir() else None


def find_weights(spec: ModelSpec) -> tuple[Weights, Path | None]:
    """Pretrained weights from --model-path, an installed package or the local HF cache when
    present, else random.

    Never downloads: the hub is consulted with local_files_only.
    """
    directory: Path | None = None
    if spec.local_path is not None and spec.local_path.is_dir():
        directory = spec.local_path
    elif (packaged := package_directory(spec)) is not None:
        directory = packaged
    elif spec.pretrained_id:
        from huggingface_hub import snapshot_download

        try:
            directory = Path(snapshot_download(spec.pretrained_id, local_files_only=True))
        except Exception:  # not in the cache: any hub error means "not available offline"
            directory = None
    if directory is not None and any((directory / name).exists() for name in WEIGHT_FILES):
        return Weights("pretrained", str(directory), _weights_fingerprint(directory)), directory
    return Weights("random", f"seed={WEIGHT_SEED}", f"seed={WEIGHT_SEED}"), directory
