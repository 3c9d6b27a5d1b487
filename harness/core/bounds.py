"""The upper bound of every count and size a user can ask for, checked before anything is built.

One definition each, used by every command (native, web, run, ab, predict, recommend, history, web
--serve) and by the suite config's keys. Each bound is what a real benchmark may want and far from
what exhausts a machine: `ab --rounds 100000000000` once grew the CLI to 23 GB building its
schedule, and a batch of 3e9 overflowed the store's INT32 columns. Every bound fits INT32.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_BATCH = 4096  # items per batch
MAX_SEQUENCE = 131_072  # tokens per sequence: the longest context window of today's models
MAX_NEW_TOKENS = 4096  # tokens generated per sequence (--mode generate)
MAX_ITERATIONS = 1_000_000  # warmup, timed iterations (minimum, cap, floor), and an ab variant's iterations per case
MAX_ROUNDS = 10_000  # ab rounds per case
MAX_THREADS = 256  # wasm threads: more cores than any browser reports
MAX_DEVICES = 1000  # devices one `web --serve` run takes (--max-devices): each holds its jobs and pages in memory
MAX_WINDOW = 1000  # history: previous points in the baseline
MAX_VALUES = 64  # values in one comma-separated list (batch sizes, sequence lengths, thread counts)


def out_of_range(name: str, values: int | Sequence[int], low: int, high: int) -> str | None:
    """The message for a count (or a list of them) outside low..high, naming the valid range; None
    when every value is inside. A list also holds between 1 and MAX_VALUES values."""
    many = not isinstance(values, int)
    given = list(values) if many else [values]  # type: ignore[arg-type]
    if many and not 1 <= len(given) <= MAX_VALUES:
        return f"{name} takes 1 to {MAX_VALUES} comma-separated values (got {len(given)})"
    bad = [v for v in given if not low <= v <= high]
    if not bad:
        return None
    kind = "whole numbers" if many else "a whole number"
    return f"{name} takes {kind} from {low} to {high:,} (got {', '.join(str(v) for v in bad[:3])})"


MAX_NAME_CHARS = 96  # a file name made from stored text (a run id): room for a hash and a suffix under 255 bytes
