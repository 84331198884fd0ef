"""The streaming source (export.stream_source) against today's float loaders, bit for bit: the default model's GGUF
(llama: q/k rows un-interleaved) against its transformers-converted float32 folder, the qwen2 stand-in GGUF (no
permutation, biases) against its own, HF folders (whole, sharded, bfloat16) against edge.model.hf_folder; row blocks
against slices of whole tensors; files that disagree with their config or cannot be read refused in one line."""

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from edge.errors import BitNestError
from edge.model.arch import config_from_hf
from edge.model.hf_folder import TOKENIZER_FILES, load_hf_folder
from export.sources import default_gguf, gguf_cache_folder, load_source, open_source
from export.stream_source import StreamSource
from tests.test_qwen2_gguf import qwen2_gguf  # noqa: F401  (the stand-in GGUF and its converted source)


@pytest.fixture(scope="module")
def converted():
    """Today's float32 folder of the default model (transformers' dequantization; cached after the first run)."""
    return gguf_cache_folder(default_gguf())


@pytest.fixture(scope="module")
def streamed(converted, tmp_path_factory):
    """The default model streamed, its metadata folder written afresh into an empty cache."""
    with pytest.MonkeyPatch.context() as m:
        m.setenv("BITNEST_CACHE", str(tmp_path_factory.mktemp("meta-cache")))
        src = open_source("default")
    yield src
    src.close()


def whole_file(folder):
    """{name: float32 tensor} of every *.safetensors file in a folder, as saved."""
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def random_blocks(n: int, gen: torch.Generator, count: int = 3) -> list[slice]:
    """`count` random row blocks of a tensor of n rows (unaligned to heads and quant blocks), an empty one, the first
    row, the last rows by a negative start, and one running past the end."""
    blocks = []
    for _ in range(count):
        a, b = sorted(torch.randint(0, n + 1, (2,), generator=gen).tolist())
        blocks.append(slice(a, b))
    return blocks + [slice(n // 2, n // 2), slice(None, 1), slice(-3, None), slice(n - 2, n + 5)]


def assert_row_blocks(src: StreamSource, whole: dict[str, torch.Tensor], gen: torch.Generator) -> None:
    for name in src.names():
        if len(src.shape(name)) == 2:
            for rows in random_blocks(src.shape(name)[0], gen):
                got = src.get(name, rows)
                assert got.dtype == torch.float32 and torch.equal(got, whole[name][rows]), f"{name} rows {rows}"


def test_default_gguf_streams_the_converted_folder_bit_for_bit(streamed, converted):
    """Every tensor (Q4_1 linears, the Q8_0 embedding, float32 norms) equals transformers' dequantized copy: the q/k
    rows llama.cpp interleaved per head are put back, no tensor missing or extra (the tied head absent)."""
    with safe_open(str(converted / "model.safetensors"), framework="pt") as f:
        names = set(f.keys()) - {"lm_head.weight"}
        assert set(streamed.names()) == names
        for name in streamed.names():
            want = f.get_tensor(name)
            got = streamed.get(name)
            assert streamed.shape(name) == tuple(want.shape), name
            assert got.dtype == torch.float32 and torch.equal(got, want), name


def test_default_gguf_row_blocks_are_slices_of_whole_tensors(streamed, gen):
    """Blocks unaligned to heads (the q/k rows' un-interleaving) and to quant blocks, in the first and last layers and
    the embedding."""
    whole = {n: streamed.get(n) for n in streamed.names() if "layers.0." in n or "layers.29." in n or "embed" in n}
    assert_row_blocks(_only(streamed, whole), whole, gen)


def _only(src: StreamSource, names) -> StreamSource:
    """A view of `src` listing only `names` (a cheaper subset for row-block sweeps)."""
    class Subset:
        shapes = {n: src.reader.shapes[n] for n in names}
        where, read, close = src.reader.where, src.reader.read, (lambda: None)
    return StreamSource(src.spec, src.hf_config, src.config, src.folder, Subset())


def test_default_gguf_metadata_folder_is_the_converted_config_and_tokenizer(streamed, converted):
    """config.json from the GGUF's metadata alone gives the converted folder's config (architecture, tied head, eos
    ids), the same tokenizer files, and no weights."""
    from transformers import AutoTokenizer

    conv = json.loads((converted / "config.json").read_text())
    assert streamed.config == config_from_hf(conv)
    writer = "transformers_version"          # which transformers wrote each (the converted folder is cached across
    assert {k: v for k, v in streamed.hf_config.items() if k != writer} == \
        {k: v for k, v in conv.items() if k != writer}                     # installs): not part of the config
    assert streamed.config.tie_word_embeddings and streamed.config.eos_token_ids == (2,)
    assert [p.name for p in streamed.tokenizer_files()] == [f for f in TOKENIZER_FILES if (converted / f).is_file()]
    assert not list(streamed.folder.glob("*.safetensors")) and not list(streamed.folder.glob("*.bin"))
    assert sum(p.stat().st_size for p in streamed.folder.iterdir()) < 8 << 20
    text = "<|im_start|>user\nWhat is 2 + 2? Ünïcödé, tabs\tand  spaces.<|im_end|>"
    ours, theirs = AutoTokenizer.from_pretrained(streamed.folder), AutoTokenizer.from_pretrained(converted)
    assert ours(text)["input_ids"] == theirs(text)["input_ids"]
    assert ours.chat_template == theirs.chat_template


def test_the_converted_folder_streams_as_an_hf_folder(converted, gen):
    src = open_source(str(converted))
    with safe_open(str(converted / "model.safetensors"), framework="pt") as f:
        assert set(src.names()) == set(f.keys()) - {"lm_head.weight"}
        for name in src.names():
            assert torch.equal(src.get(name), f.get_tensor(name)), name
        some = [n for n in src.names() if "layers.7." in n or "embed" in n]
        assert_row_blocks(_only(src, some), {n: f.get_tensor(n) for n in some}, gen)
    assert src.config == config_from_hf(json.loads((converted / "config.json").read_text()))
    src.close()


def test_qwen2_gguf_streams_its_converted_folder(qwen2_gguf, tmp_path, monkeypatch, gen):  # noqa: F811
    """The qwen2 stand-in (Q5_0 / Q8_0 / Q4_K / Q6_K, q/k/v biases, untied head): no permutation, every tensor equal to
    transformers' conversion and to gguf-py's own values."""
    path, want, _ = qwen2_gguf
    monkeypatch.setenv("BITNEST_CACHE", str(tmp_path / "converted"))
    loaded = load_source(str(path))                              # transformers' dequantization into a float32 folder
    monkeypatch.setenv("BITNEST_CACHE", str(tmp_path))
    with open_source(str(path)) as src:
        assert src.config == loaded.config and not src.config.tie_word_embeddings and src.config.attention_bias
        assert set(src.names()) == set(loaded.tensors)
        for name in src.names():
            assert torch.equal(src.get(name), loaded.tensors[name]), name
        for name, values in want.items():
            assert torch.equal(src.get(name), torch.from_numpy(values).float()), name
        assert_row_blocks(src, loaded.tensors, gen)


@pytest.fixture
def tiny_folder(small_llama_folder, tmp_path):
    """A writable copy of the 2-layer Llama HF folder of tests/conftest.py."""
    return shutil.copytree(small_llama_folder, tmp_path / "tiny")


def test_sharded_and_bfloat16_folders_stream_as_hf_folder_loads_them(tiny_folder, tmp_path, gen):
    """Two bfloat16 shards with model.safetensors.index.json give, tensor by tensor and row block by row block,
    the float32 tensors edge.model.hf_folder loads from them (a tied model's saved head left out, as it leaves it)."""
    tensors = {k: v.to(torch.bfloat16) for k, v in whole_file(tiny_folder).items()}
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()   # a tied head saved anyway: not listed
    (tiny_folder / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(tiny_folder / file))
    weight_map = {k: file for file, keys in shards.items() for k in keys}
    (tiny_folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    loaded = load_hf_folder(tiny_folder, "tiny")
    with open_source(str(tiny_folder)) as src:
        assert set(src.names()) == set(loaded.tensors)
        for name in src.names():
            got = src.get(name)
            assert got.dtype == torch.float32 and torch.equal(got, loaded.tensors[name]), name
        assert_row_blocks(src, loaded.tensors, gen)
        assert src.tokenizer_files() == loaded.tokenizer_files()


def test_a_tensor_of_the_wrong_shape_is_refused_in_one_line_naming_it(tiny_folder):
    tensors = whole_file(tiny_folder)
    name = "model.layers.1.mlp.down_proj.weight"
    assert tuple(tensors[name].shape) == (128, 256)
    tensors[name] = tensors[name][:, :200].clone()
    save_file(tensors, str(tiny_folder / "model.safetensors"))
    with pytest.raises(BitNestError) as e:
        open_source(str(tiny_folder))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{name} is [128, 200] in {tiny_folder / 'model.safetensors'}")
    assert "the config implies [128, 256]" in msg, msg


@pytest.mark.parametrize("drop, fragment", [
    ("model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.k_proj.weight is missing from"),
    ("model.norm.weight", "model.norm.weight is missing from"),
])
def test_a_missing_tensor_is_refused_in_one_line_naming_it(tiny_folder, drop, fragment):
    tensors = whole_file(tiny_folder)
    del tensors[drop]
    save_file(tensors, str(tiny_folder / "model.safetensors"))
    with pytest.raises(BitNestError, match=f"^{fragment}") as e:
        open_source(str(tiny_folder))
    assert "\n" not in str(e.value)


def test_a_layer_past_the_config_is_refused(tiny_folder):
    tensors = whole_file(tiny_folder)
    tensors["model.layers.2.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.up_proj.weight"].clone()
    save_file(tensors, str(tiny_folder / "model.safetensors"))
    with pytest.raises(BitNestError, match="model.layers.2.mlp.up_proj.weight is in .* the config has 2 layers"):
        open_source(str(tiny_folder))


def test_unreadable_files_are_one_line_errors(tiny_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("BITNEST_CACHE", str(tmp_path / "cache"))
    (tiny_folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    bad_gguf = tmp_path / "broken.gguf"
    bad_gguf.write_bytes(b"GGUF" + bytes(60))
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(default_gguf().read_bytes()[: 60 << 20])
    for spec, start in ((tiny_folder, f"cannot read {tiny_folder / 'model.safetensors'}: "),
                        (bad_gguf, f"cannot read GGUF file {bad_gguf}: "),
                        (truncated, f"cannot read GGUF file {truncated}: ")):
        with pytest.raises(BitNestError) as e:
            open_source(str(spec))
        assert "\n" not in str(e.value) and str(e.value).startswith(start), str(e.value)


def test_row_blocks_are_contiguous_blocks_of_2d_tensors(streamed):
    with pytest.raises(ValueError):
        streamed.get("model.layers.0.self_attn.q_proj.weight", slice(0, 10, 2))
    with pytest.raises(ValueError):
        streamed.get("model.norm.weight", slice(0, 10))
    with pytest.raises(KeyError):
        streamed.get("lm_head.weight")
