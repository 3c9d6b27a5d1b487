"""Every count and size a user gives has an upper bound (harness.core.bounds), checked before anything is
built: exit 2, the valid range in the message, nothing written, and memory flat — `ab --rounds
100000000000` once grew the CLI to 23 GB building its schedule before the OOM killer ended it."""

from __future__ import annotations

import resource
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import CLI, run_cli

# An address-space limit on the CLI: a command that starts building what it was asked for (a schedule
# of 1e11 rounds, 477 GiB of inputs) fails with MemoryError (exit 1) instead of exiting 2.
ADDRESS_SPACE = 2 * 2**30
ENOUGH = '[model_families]\nembedding = ["bert-tiny"]\n'
NATIVE = ["native", "--model", "bert-tiny", "--hardware", "cpu", "--engines", "onnxruntime"]
WEB = ["web", "--model", "bert-tiny", "--hardware", "wasm"]
AB = ["ab", "--a", "bert-tiny", "--b", "bert-tiny"]
SEVENTY = ",".join(str(n) for n in range(1, 71))


# The first case runs the real CLI under the limit; the others run the app in this process (a Python start is
# ~0.8 s of CPU) under the same headroom: the limit is this process's address space now plus ADDRESS_SPACE.
BOUNDED = [
    ([*AB, "--rounds", "100000000000"], "--rounds takes a whole number from 6 to 10,000 (got 100000000000)"),
    ([*AB, "--block", "100000"], "--rounds × --block: at most 1,000,000 iterations per variant and case"),
    ([*AB, "--batch-sizes", "5000"], "--batch-sizes takes whole numbers from 1 to 4,096 (got 5000)"),
    ([*AB, "--warmup", "2000000"], "--warmup takes a whole number from 0 to 1,000,000 (got 2000000)"),
    ([*NATIVE, "--batch-sizes", "1,3000000000"], "--batch-sizes takes whole numbers from 1 to 4,096 (got 300000"),
    ([*NATIVE, "--sequence-lengths", "200000"], "--sequence-lengths takes whole numbers from 1 to 131,072 (got"),
    ([*NATIVE, "--sequence-lengths", SEVENTY], "--sequence-lengths takes 1 to 64 comma-separated values (got 70)"),
    ([*NATIVE, "--iterations", "2000000"], "--iterations takes a whole number from 1 to 1,000,000 (got 2000000)"),
    ([*NATIVE, "--max-iterations", "9999999999"], "--max-iterations takes a whole number from 20 to 1,000,000"),
    ([*NATIVE, "--min-iterations", "2000000"], "--min-iterations takes a whole number from 1 to 1,000,000"),
    ([*NATIVE, "--warmup", "99999999999"], "--warmup takes a whole number from 0 to 1,000,000 (got 99999999999)"),
    ([*NATIVE, "--mode", "generate", "--new-tokens", "100000"], "--new-tokens takes a whole number from 1 to 4,0"),
    ([*WEB, "--threads", "1,999"], "--threads takes whole numbers from 1 to 256 (got 999)"),
    ([*WEB, "--batch-sizes", "5000"], "--batch-sizes takes whole numbers from 1 to 4,096 (got 5000)"),
    ([*WEB, "--serve", "--serve-timeout", "1e9"], "--serve-timeout takes a finite number of seconds > 0 and <="),
    (["run", "--model", "bert-tiny", "--sequence-lengths", "200000"], "--sequence-lengths takes whole numbers fr"),
    (["predict", "--model", "bert-tiny", "--batch-sizes", "99999"], "--batch-sizes takes whole numbers from 1 to"),
    (["predict", "--model", "bert-tiny", "--timeout", "inf"], "--timeout takes a finite number of seconds > 0 and"),
    (["recommend", "--batch-size", "3000000000"], "--batch-size takes a whole number from 1 to 4,096 (got 3000"),
    (["history", "--model", "bert-tiny", "--window", "100000"], "--window takes a whole number from 1 to 1,000"),
    (["history", "--model", "bert-tiny", "--batch-size", "3000000000"], "--batch-size takes a whole number from"),
    (["suite", "--check", "--config", "@batch_sizes = [1, 3000000000]"], "key 'batch_sizes' takes whole numbers"),
    (["suite", "--check", "--config", "@warmup_iterations = 99999999"], "key 'warmup_iterations' takes a whole"),
    (["suite", "--check", "--config", "@benchmark_iterations = 0"], "key 'benchmark_iterations' takes a whole"),
    (["suite", "--check", "--config", "@min_iterations = 2000000"], "key 'min_iterations' takes a whole number"),
    (["suite", "--check", "--config", "@web_threads = [1, 999]"], "key 'web_threads' takes whole numbers from 1"),
    (["suite", "--check", "--config", f"@sequence_lengths = [{SEVENTY}]"], "key 'sequence_lengths' takes 1 to 64"),
    (["suite", "--check", "--config", "@new_tokens = 3000000000"], "key 'new_tokens' takes a whole number from"),
]


@pytest.mark.parametrize(("args", "message"), BOUNDED)
def test_every_count_is_bounded_before_anything_is_built(tmp_path: Path, args: list[str], message: str) -> None:
    """Run in tmp_path (the default DB and output dir land there) under an address-space limit: exit 2, one
    line naming the valid range, no file created. "@KEY = VALUE": a suite config holding that key."""
    real = args is BOUNDED[0][0]
    args = [_config(tmp_path, a[1:]) if a.startswith("@") else a for a in args]
    if real:
        done = subprocess.run(
            [*CLI, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path, preexec_fn=_limit_address_space
        )
    else:
        with _address_space_headroom():
            done = run_cli(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert [p.name for p in tmp_path.iterdir()] == (["suite.toml"] if "suite" in args else [])


def _config(tmp_path: Path, line: str) -> str:
    path = tmp_path / "suite.toml"
    path.write_text(f"{line}\n{ENOUGH}")
    return str(path)


def _limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, resource.getrlimit(resource.RLIMIT_AS)[1]))


@contextmanager
def _address_space_headroom() -> Iterator[None]:
    """This process may map ADDRESS_SPACE more than it has now (a command that builds what it was asked for
    fails with MemoryError, which the in-process runner reports as exit 1 and a traceback); the soft limit
    is put back after (lowering and raising a soft limit up to the hard one needs no privilege)."""
    mapped = next(
        int(line.split()[1]) * 1024
        for line in Path("/proc/self/status").read_text().splitlines()
        if line.startswith("VmSize:")
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (mapped + ADDRESS_SPACE, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_bounds_fit_the_stores_int32_columns() -> None:
    """Batch sizes, sequence lengths, new tokens and iteration counts land in INT32 columns."""
    from harness.core import bounds

    limits = [v for name, v in vars(bounds).items() if name.startswith("MAX_")]
    assert limits and all(0 < v < 2**31 for v in limits)
