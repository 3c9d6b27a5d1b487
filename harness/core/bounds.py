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
MAX_DEPTH = MAX_SEQUENCE  # tokens of KV cache filled before a generation (--depths); the model's context bounds it too
MAX_ITERATIONS = 1_000_000  # warmup, timed iterations (minimum, cap, floor), and an ab variant's iterations per case
MAX_ROUNDS = 10_000  # ab rounds per case
MAX_THREADS = 256  # wasm threads: more cores than any browser reports
MAX_PORT = 65_535  # a TCP port (web --serve's --port; 0: a free one)
MAX_DEVICES = 1000  # devices one `web --serve` run takes (--max-devices): each holds its jobs and pages in memory
MAX_WINDOW = 1000  # history: previous points in the baseline
MAX_VALUES = 64  # values in one comma-separated list (batch sizes, sequence lengths, thread counts)
# Bundles (harness.bundle): data from another machine, bounded before it is read. A bundle's members are
# stored, not compressed, so its file size bounds every byte read from it; its tables' rows are counted
# from the manifest and the Parquet metadata before a table is loaded. 10,000 results of 100 samples
# make a bundle of 8 MiB and 1,000,000 sample rows (bench/bundle_size.py): these are 128 and 10 times that.
MAX_BUNDLES = 1000  # bundles in one import
MAX_BUNDLE_BYTES = 2**30  # one bundle file
MAX_MANIFEST_BYTES = 16 * 2**20  # its manifest.json (parsed in memory)
MAX_BUNDLE_ROWS = 10_000_000  # rows of one table of a bundle
MAX_RUNS = 100_000  # runs named by one manifest
MAX_ID_CHARS = 128  # a run, result, machine or device id (harness.store.IDENTIFIER)
MAX_PLATFORM_REASON_CHARS = 4096  # a platform's reason (a browser's words) arriving from another machine


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


# A model folder's configs (genai_config.json, config.json), read as data (harness.prepare.folder_checks):
# their size before parsing, and the sizes they give a model before anything is built from them. Generous:
# today's largest models have 126 layers, 128 heads, hidden 16,384, head size 256, 256 K tokens of vocabulary.
MAX_CONFIG_BYTES = 16 * 2**20  # a config file read (bytes)
MAX_LAYERS = 1024  # layers of an encoder or a decoder
MAX_HEADS = 1024  # attention heads, key/value heads
MAX_HIDDEN = 65_536 * 4  # hidden and intermediate (feed-forward) widths
MAX_HEAD_SIZE = 65_536  # one attention head's width
MAX_VOCAB = 4 * 2**20  # tokens in a vocabulary
MAX_CONTEXT = 16 * 2**20  # positions, context length, a generation's max_length
MAX_NAME_CHARS = 96  # a file name made from stored text (a run id): room for a hash and a suffix under 255 bytes
# A GGUF given as the model (--model-path x.gguf, harness.prepare.gguf_file): its header walked as data, every count
# and length bounded before it is trusted. Today's GGUFs: a 405B model in one file is ~250 GB at Q4 (split files
# are refused), ~1,100 tensors, ~40 metadata keys, 256 K tokens and merges, a chat template under 20 KB.
GGUF_BYTES_BOUND = 512 * 2**30  # the file (no MAX_ prefix: past INT32, as WORK_BYTES_BOUND)
MAX_GGUF_TENSORS = 65_536  # tensors in its header (a mixture of experts' per-expert tensors included)
MAX_GGUF_KEYS = 4096  # metadata keys
MAX_GGUF_STRING_BYTES = 2**20  # one string: a key, a value, a tensor's name, one token's text
MAX_GGUF_ARRAY = MAX_VOCAB  # items of one metadata array (the tokens, their types, the merges)
MAX_GGUF_HEADER_BYTES = 512 * 2**20  # the header: metadata and tensor infos, before the tensors' data
# A WebLLM model folder (--webllm-model DIR, harness.prepare.mlc_folder): mlc_llm writes ~100 MB params shards
# (a 70B model at q4f16 is ~400 of them) and a model library of 5-30 MB; its configs are MAX_CONFIG_BYTES-bounded.
MLC_BYTES_BOUND = 512 * 2**30  # the weights' shards together (no MAX_ prefix: past INT32)
MAX_MLC_SHARDS = 65_536  # params shards its tensor cache names
MAX_MLC_LIBRARY_BYTES = 2**30  # its compiled model library (.wasm)
MAX_MLC_ENTRIES = 4096  # directory entries looked at to find the library
# Prompts (harness.prepare.prompts): a folder's tokenizer files are data from elsewhere, bounded before they are
# read; a prompt given on the command line is bounded before it is tokenized. Llama 3's tokenizer.json is 9 MB,
# Gemma 3's 33 MB; a chat template of today's models is under 20 KB.
MAX_TOKENIZER_BYTES = 64 * 2**20  # a tokenizer.json read
MAX_PROMPT_CHARS = 1_000_000  # characters of --prompt text
MAX_PROMPT_IDS = 4096  # token ids in --prompt-ids (one comma-separated list)
MAX_TEMPLATE_CHARS = 256 * 1024  # a chat template's source
# Speech input (harness.prepare.audio): a WAV from elsewhere (--audio) is data, bounded from its header before
# its samples are read; --audio-seconds is bounded by the longest window of today's speech models (Whisper's
# 30 s: the encoder reads 3000 log-mel frames whatever the clip's length), each model's own window checked too.
MAX_AUDIO_SECONDS = 30  # --audio-seconds: the audio a speech case is fed, in whole seconds
MAX_AUDIO_FILE_SECONDS = 600  # a --audio file's duration (its first window is used; ten minutes is generous)
MAX_AUDIO_BYTES = 256 * 2**20  # a --audio file's size: ten minutes of 8 channels of 24-bit 48 kHz is 207 MiB
MAX_AUDIO_CHANNELS = 8  # channels of a --audio file (mixed to mono, as Whisper's processor takes one)
MIN_AUDIO_RATE, MAX_AUDIO_RATE = 8_000, 192_000  # a --audio file's sampling rate (Hz), resampled to the model's
MAX_TRANSCRIPT_BYTES = 2**20  # a --transcript file (UTF-8 text): ten minutes of speech is ~10 KB
# Text a bundle's rows carry (harness.bundle.checks): at most what a fresh run could store, so a row from elsewhere
# cannot grow every report written from it (a 10 MB output_text made 20 MB of CSV and JSON). A token decodes to a few
# characters, a long one (a run of spaces, a special token's name such as <|reserved_special_token_250|>) to tens:
# an output text holds at most this many characters per token generated.
MAX_TOKEN_TEXT_CHARS = 1024
MAX_TEXT_CELL_BYTES = 2**20  # any other text of a row: an error with its worker's log tail, a name, a kernel, a reason
DETAILS_BYTES_PER_ITERATION = 32  # a row's details: MAX_TEXT_CELL_BYTES and a number per timed iteration (encoder's)
# A graph's counted work remembered on disk (harness.prepare.work_memo): an entry past these holds no count of a
# graph a machine can run, so it is counted again, never trusted. Weights and a KV cache a forward reads must be
# in some machine's memory (256 TiB is more than any holds); 2^60 FLOPs is over a thousand seconds of an H200's
# dense peak per token or item. A real count past them is still reported, only not remembered. (No MAX_ prefix:
# they bound DOUBLE columns, not the INT32 ones every MAX_ fits.)
WORK_BYTES_BOUND = 2**48  # bytes read per token or item, a graph's weight bytes, a decode step's KV cache bytes
WORK_FLOPS_BOUND = 2**60  # FLOPs per token or item
MAX_WORK_POSITIONS = MAX_SEQUENCE + MAX_DEPTH + MAX_NEW_TOKENS  # a decode step's mean cached positions
MAX_GRAPH_NODES = 2**24  # the nodes a decode step dispatches (a 2 GiB ONNX file's protobuf holds fewer)
# A folder's chat template is a program from elsewhere (harness.prepare.prompts): rendered in a process of its own,
# stopped at this deadline and held to this much address space above its start. A template of today's models
# renders in milliseconds and a few MiB.
MAX_TEMPLATE_SECONDS = 5  # wall-clock seconds of one render, the process's start included
MAX_TEMPLATE_MEMORY = 512 * 2**20  # bytes the render process may map beyond what it mapped at its start
