"""Issue 42 items 1-3 and 6b: a model folder's chat template and tokenizer.json are programs and data from
elsewhere, and cannot hang, crash or lie. A template's own error, a loop that writes nothing, a template that asks
for gigabytes: the template is rendered in a process of its own (a deadline, an address-space limit, jinja2's
sandbox with size checks), and each is "the folder's chat template failed to render: …", exit 2, one line, no
store. A tokenizer.json the library panics on, or cannot encode a prompt with, is a refusal naming the folder's
tokenizer; one that cannot decode a row's tokens costs the row its text, not its measurement. EOS ids a model
cannot make are left out, and the row's policy says so. Every hostile input is a real file in a real folder."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import CLI

from harness.prepare.prompts import PromptError, chat_text, encode, load_tokenizer, model_eos_ids, text_fields

CHATML = (  # SmolLM2's (and Qwen's) template, as its tokenizer_config.json holds it
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3 = (  # Llama 3's, shortened: bos_token, a loop with `set`, string concatenation, trim filters
    "{{ bos_token }}{% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# the templates of issue 42 items 1 and 2, and what the refusal says after "failed to render: "
ERRORS = [
    ("{% for x in range(10**9) %}{% endfor %}", "OverflowError: Range too big"),
    ("{{ 1/0 }}", "ZeroDivisionError: division by zero"),
    ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
    ("{{ ''.__class__.__mro__[1] }}", "SecurityError: access to attribute '__class__' of 'str' object is unsafe"),
]
ALLOCATING = [  # refused by the sandbox's size checks before Python builds them (10 GB, 1 GB, 8 GB)
    ("{{ 'a' * 10**10 }}", "a repeat of 10,000,000,000 items is past the render's bound of 1,000,002"),
    ("{{ 'x'|center(10**9) }}", "a width of 1,000,000,000 is past the render's bound"),
    ("{% set l = [0]*10**9 %}", "a repeat of 1,000,000,000 items is past the render's bound"),
    ("{{ 'x'.ljust(10**9) }}", "a width of 1,000,000,000 is past the render's bound"),
    # past the checks: the address-space limit of the render process stops them
    ("{{ '%*s' % (10**9, 'x') }}", "it needed more than 512 MiB of memory"),
    ("{% set ns = namespace(x='ab') %}{% for i in range(60) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}",
     "it needed more than 512 MiB of memory"),
]  # fmt: skip
ENDLESS = [
    "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}",
    "{{ lipsum(10**6) }}",
]
GIGABYTE_KB = 10**9 // 1024  # ru_maxrss is in KiB on Linux


def folder_with(root: Path, template: str | None = None, vocab: int = 128, **tokenizer: object) -> Path:
    """A tiny Llama-like folder: config.json, a word-level tokenizer.json of t0..t{vocab-1} (t0 unk, t2 eos) with
    `tokenizer`'s keys over its own, tokenizer_config.json, and the chat template (chat_template.jinja)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    root.mkdir(parents=True, exist_ok=True)
    made = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    made.pre_tokenizer = pre_tokenizers.Whitespace()
    data = json.loads(made.to_str()) | tokenizer
    (root / "tokenizer.json").write_text(json.dumps(data))
    (root / "tokenizer_config.json").write_text(json.dumps({"bos_token": "t1", "eos_token": "t2", "unk_token": "t0"}))
    (root / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": vocab}))
    if template is not None:
        (root / "chat_template.jinja").write_text(template)
    return root


def refused_by_cli(folder: Path, tmp_path: Path, *prompt: str) -> tuple[str, int, float]:
    """A generate run of the folder, which must be refused when it is checked: exit 2, one line, no traceback (a
    Rust panic's lines neither), no store. Its stderr, the peak RSS of the CLI and the processes it started (KiB,
    read in a process of its own so no other test's children count), and the seconds it took."""
    db = tmp_path / "refused.duckdb"
    command = [*CLI, "native", "--model-path", str(folder), "--mode", "generate", *prompt, "--db", str(db)]
    peak = ("import json, resource, subprocess, sys; done = subprocess.run(sys.argv[1:], capture_output=True, "
            "text=True); print(json.dumps([done.returncode, done.stderr, "
            "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))")  # fmt: skip
    started = time.monotonic()
    measured = subprocess.run([sys.executable, "-c", peak, *command], capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - started
    returncode, stderr, rss = json.loads(measured.stdout)
    assert returncode == 2, stderr
    assert "Traceback" not in stderr and "panicked" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not db.exists()
    return stderr, rss, elapsed


@pytest.mark.parametrize(("template", "words"), ERRORS + ALLOCATING)
def test_a_template_s_own_error_or_allocation_is_a_refusal(template: str, words: str, tmp_path: Path) -> None:
    """Each was an OverflowError / ZeroDivisionError / MemoryError traceback (exit 1), `'a' * 10**10` 10 GB."""
    folder = folder_with(tmp_path, template)
    with pytest.raises(PromptError, match="the folder's chat template failed to render: ") as refused:
        chat_text(folder, "t5")
    assert words in str(refused.value)


def test_hostile_templates_through_the_cli_exit_2_in_one_line_within_a_gigabyte(tmp_path: Path) -> None:
    """One per kind through the real CLI: an error, one the sandbox refuses before allocating 10 GB, two that only
    the render process's address-space limit stops; the CLI and its children peak well under 1 GB."""
    cases = [ERRORS[1], ALLOCATING[0], ALLOCATING[4], ALLOCATING[5]]
    for index, (template, words) in enumerate(cases):
        folder = folder_with(tmp_path / f"m{index}", template)
        stderr, rss, _ = refused_by_cli(folder, tmp_path, "--chat", "--prompt", "t5")
        assert f"the folder's chat template failed to render: {words}" in stderr
        assert rss < GIGABYTE_KB, f"{template}: peak RSS {rss / 1024:.0f} MiB"
        print(f"{template}: peak RSS {rss / 1024:.0f} MiB")


def test_a_template_that_loops_without_writing_is_stopped_at_its_deadline(tmp_path: Path) -> None:
    """Nested loops that write nothing (10^10 turns) and lipsum(10**6) never passed the output bound: they ran
    until --timeout, or forever. The render process is killed at 5 s: through the CLI, refused within 10 s."""
    folder = folder_with(tmp_path / "nested", ENDLESS[0])
    stderr, _, elapsed = refused_by_cli(folder, tmp_path, "--chat", "--prompt", "t5")
    assert "the folder's chat template failed to render: it ran past 5 s and was stopped" in stderr
    assert elapsed < 10, elapsed
    folder = folder_with(tmp_path / "lipsum", ENDLESS[1])
    started = time.monotonic()
    with pytest.raises(PromptError, match="it ran past 5 s and was stopped"):
        chat_text(folder, "t5")
    assert time.monotonic() - started < 10
    print(f"the CLI refused the nested loop in {elapsed:.2f} s")


@pytest.mark.parametrize("template", [CHATML, LLAMA3])
def test_a_real_template_renders_as_the_sandbox_always_did_and_fast(template: str, tmp_path: Path) -> None:
    """The process and the size checks change nothing for a template of today's models: the same text as jinja2's
    sandbox rendering it in this process, then the same ids; a render (the process's start included) under 1 s."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    folder = folder_with(tmp_path, template)
    text = "t5 t6 \u00e9\U0001f600 " + "t7 " * 1000  # non-ASCII, and a longer prompt, come back as they went
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    expected = environment.from_string(template).render(
        messages=[{"role": "user", "content": text}], add_generation_prompt=True, bos_token="t1", eos_token="t2"
    )
    timings = []
    for _ in range(3):
        started = time.monotonic()
        assert chat_text(folder, text) == expected
        timings.append(time.monotonic() - started)
    assert min(timings) < 1, timings
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert encode(folder, text, chat=True) == tokenizer.encode(expected, add_special_tokens=False).ids
    print(f"a render of {len(expected):,} characters: {', '.join(f'{t:.3f} s' for t in timings)}")


def test_a_tokenizer_that_panics_or_cannot_encode_the_prompt_is_a_refusal(tmp_path: Path) -> None:
    """A Split pre-tokenizer whose regex exhausts Oniguruma's retry limit made the library panic (pyo3's
    PanicException, a BaseException: `except Exception` missed it); a word-level tokenizer without its unk token
    raised "Missing [UNK] token" from prompts.encode. Both are the folder's tokenizer refusing the prompt, exit 2;
    the panic's own lines (with RUST_BACKTRACE, its Rust stack) never reach the terminal."""
    split = {"type": "Split", "pattern": {"Regex": "(a+)+$"}, "behavior": "Isolated", "invert": False}
    panics = folder_with(tmp_path / "panics", pre_tokenizer=split)
    no_unk = folder_with(tmp_path / "no_unk")
    data = json.loads((no_unk / "tokenizer.json").read_text())
    data["model"]["unk_token"] = "[UNK]"  # not in its vocabulary
    (no_unk / "tokenizer.json").write_text(json.dumps(data))
    cases = [
        (panics, "a" * 30 + "!", "cannot encode this prompt: Onig: Regex search error: retry-limit-in-match over"),
        (no_unk, "t5 hello", "cannot encode this prompt: WordLevel error: Missing [UNK] token from the vocabulary"),
    ]
    for folder, prompt, words in cases:
        with pytest.raises(PromptError, match=re.escape("the folder's tokenizer " + words)):
            encode(folder, prompt, chat=False)
        stderr, _, _ = refused_by_cli(folder, tmp_path, "--prompt", prompt)
        assert f"the folder's tokenizer {words} (tokenizer.json in {folder})" in stderr
    assert encode(panics, "t5", chat=False) == [5]  # the same tokenizer, on text its regex is quick on
    unreadable = folder_with(tmp_path / "unreadable", model={"type": "NoSuchModel"})
    with pytest.raises(PromptError, match="the folder's tokenizer cannot be read by the tokenizers library: "):
        encode(unreadable, "t5", chat=False)


def test_the_tokenizer_guard_passes_interrupts_and_other_lines_on(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """The guard turns what the library raises into a PromptError, but a Ctrl-C is still a Ctrl-C; what a call
    that returns wrote to stderr (another thread's line) is passed on, not swallowed with a panic's lines."""
    import os

    from harness.prepare.prompts import _tokenizer_call

    def interrupted() -> None:
        raise KeyboardInterrupt

    def writes() -> int:
        os.write(2, b"a line of another thread\n")
        return 7

    with pytest.raises(KeyboardInterrupt):
        _tokenizer_call(tmp_path, "encode this prompt", interrupted)
    assert _tokenizer_call(tmp_path, "encode this prompt", writes) == 7
    assert "a line of another thread" in capfd.readouterr().err


def eos_folder(root: Path, eos: list[int]) -> Any:
    """The spec of a folder of a 1,000-token vocabulary whose generation_config.json states `eos`, and whose
    tokenizer's decoder panics on one of its tokens (1000: 'aaa…a!', a Replace decoder's regex exhausting
    Oniguruma's retry limit)."""
    from harness.prepare.specs import spec_from_path

    folder = folder_with(root, vocab=1000)
    data = json.loads((folder / "tokenizer.json").read_text())
    data["model"]["vocab"]["a" * 30 + "!"] = 1000
    data["decoder"] = {"type": "Replace", "pattern": {"Regex": "(a+)+$"}, "content": ""}
    (folder / "tokenizer.json").write_text(json.dumps(data))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return spec_from_path(folder, None)


def test_a_row_whose_tokens_cannot_be_decoded_keeps_its_measurement_and_says_why(tmp_path: Path) -> None:
    """Decoding a row's tokens panicked the library inside text_fields (a worker's traceback, the row lost): its
    output_text is NULL, details say why, and its prompt ids and EOS policy stay."""
    spec = eos_folder(tmp_path, [2])
    details: dict = {}
    fields = text_fields(spec, np.array([[5, 6]]), [[7, 1000]], (2,), True, details)
    assert fields == {"prompt_ids": [[5, 6]], "output_text": None, "output_texts": None, "stop_at_eos": True}
    assert details["output_text"].startswith("not decoded: the folder's tokenizer cannot decode the model's tokens: ")
    assert "retry-limit-in-match over" in details["output_text"] and details["eos_policy"] == "stop at EOS (2)"
    assert text_fields(spec, np.array([[5]]), [[7, 8]], (2,), True, {})["output_texts"] == ["t7t8"]


def test_a_token_spelled_as_a_megabyte_is_cut_to_the_bound_import_holds_it_to(tmp_path: Path) -> None:
    """A folder's tokenizer may spell a token as a megabyte: a fresh row's text is cut to MAX_TOKEN_TEXT_CHARS per
    token (what `import` takes of a bundle's text, so a store's own export is never refused), and the row says so."""
    from harness.core.bounds import MAX_TOKEN_TEXT_CHARS

    spec = eos_folder(tmp_path, [2])
    data = json.loads((spec.local_path / "tokenizer.json").read_text())
    data["model"]["vocab"]["x" * (1 << 20)] = 1001
    (spec.local_path / "tokenizer.json").write_text(json.dumps(data))
    load_tokenizer.cache_clear()
    details: dict = {}
    fields = text_fields(spec, np.array([[5]]), [[7, 1001]], (2,), True, details)
    assert fields["output_text"] == ("t7" + "x" * (1 << 20))[: 2 * MAX_TOKEN_TEXT_CHARS]
    assert fields["output_texts"] == [fields["output_text"]] and "cut to 1,024 characters" in details["output_text_cut"]
    plain: dict = {}
    assert text_fields(spec, np.array([[5]]), [[7, 8]], (2,), True, plain)["output_text"] == "t7t8"
    assert "output_text_cut" not in plain


def test_eos_ids_outside_the_vocabulary_are_left_out_and_the_policy_says_which(tmp_path: Path) -> None:
    """generation_config.json's [10**20, 5000] on a 1,000-token vocabulary: the row said "stop at EOS
    (100000000000000000000, 5000)", ids the model can never make. Now they are left out, and named."""
    spec = eos_folder(tmp_path / "some", [10**20, 999, 5000, 999])
    assert model_eos_ids(spec) == (999,)
    details: dict = {}
    assert text_fields(spec, np.array([[5]]), [[7]], model_eos_ids(spec), True, details)["stop_at_eos"]
    assert details["eos_policy"] == (
        "stop at EOS (999); 100000000000000000000, 5000 left out: outside the model's vocabulary (ids 0 to 999)"
    )
    spec = eos_folder(tmp_path / "none", [10**20, 5000])
    assert model_eos_ids(spec) == ()
    details = {}
    assert not text_fields(spec, np.array([[5]]), [[7]], model_eos_ids(spec), True, details)["stop_at_eos"]
    assert details["eos_policy"] == (
        "--stop-at-eos asked, but the model states no EOS id inside its vocabulary: ran to --new-tokens; "
        "100000000000000000000, 5000 left out: outside the model's vocabulary (ids 0 to 999)"
    )
    details = {}
    text_fields(spec, np.array([[5]]), [[7]], (), False, details)  # not asked: nothing to say about EOS ids
    assert details["eos_policy"] == "EOS ignored"
