"""Model specs: the shipped files, selection rules and their errors."""

from pathlib import Path

import pytest

from harness.prepare.specs import FAMILIES, SpecError, load_specs, parse_spec_file, select_specs, spec_from_path


def test_every_family_has_a_base_and_tiny_model() -> None:
    specs = load_specs()
    for family in FAMILIES:
        variants = {s.variant for s in specs.values() if s.family == family}
        assert {"base", "tiny"} <= variants <= {"base", "tiny", "small"}, family
    # the decoders' small members (issue 46): run by name only, random weights, between tiny and base in size
    small = {s.name for s in specs.values() if s.variant == "small"}
    assert small == {"llama-small", "qwen2-small", "gpt2-small-random"}
    assert all(specs[n].pretrained_id is None and specs[n].family == "text_generation" for n in small)
    assert not {s.variant for s in select_specs(None, None, small=True)} & {"small"}
    bert = specs["bert-base-uncased"]
    assert bert.config["hidden_size"] == 768 and bert.config["num_hidden_layers"] == 12
    tiny = specs["bert-tiny"]
    assert tiny.config["hidden_size"] == 128
    assert tiny.config["vocab_size"] == 30522  # inherited from base
    assert tiny.pretrained_id is None  # pretrained weights only fit the base dimensions


def test_clip_tiny_merges_nested_configs() -> None:
    clip = load_specs()["clip-tiny"]
    assert clip.config["text_config"]["hidden_size"] == 32
    assert clip.config["text_config"]["max_position_embeddings"] == 77


def test_selection_by_family_and_small_models() -> None:
    chosen = select_specs(None, ["vision", "audio"], small=True)
    assert sorted(s.name for s in chosen) == [
        "clap-tiny",
        "detr-tiny",
        "resnet-tiny",
        "vit-tiny",
        "wav2vec2-tiny",
        "whisper-tiny",
    ]
    assert {s.variant for s in select_specs(None, None, small=False)} == {"base"}


@pytest.mark.parametrize(
    ("names", "families", "message"),
    [
        (["bert-huge"], None, "unknown model 'bert-huge'; valid: all-minilm-l6-v2, bert-base-uncased"),
        (None, ["speech"], "unknown model family 'speech'; valid: embedding"),
    ],
)
def test_selection_errors_name_the_valid_values(names, families, message) -> None:
    with pytest.raises(SpecError, match=message):
        select_specs(names, families, small=False)


def test_spec_file_errors_name_file_and_key() -> None:
    with pytest.raises(SpecError, match=r"x\.toml: family 'robots' is not one of"):
        parse_spec_file(Path("x.toml"), 'family = "robots"\n[inputs]\nkind = "text"\n')
    with pytest.raises(SpecError, match=r"x\.toml: not valid TOML"):
        parse_spec_file(Path("x.toml"), "family = ")
    with pytest.raises(SpecError, match=r"x\.toml \[inputs\]: missing key 'kind'"):
        parse_spec_file(Path("x.toml"), 'family = "vision"\n[inputs]\n')


def test_model_path_errors(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="no such file"):
        spec_from_path(tmp_path / "missing.onnx", None)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(SpecError, match=r"expected an \.onnx file"):
        spec_from_path(tmp_path / "notes.txt", None)
    (tmp_path / "config.json").write_text('{"model_type": "mamba"}')
    with pytest.raises(SpecError, match="model_type 'mamba' has no spec"):
        spec_from_path(tmp_path, None)
