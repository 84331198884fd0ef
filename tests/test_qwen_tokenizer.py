"""Qwen2.5's end-of-generation set from its real tokenizer, offline (CI never downloads the model):
tests/data/Qwen2.5-Coder-0.5B-Instruct.gguf.xz is the shipped preset's GGUF with every metadata key (config, tokenizer,
chat template) and none of its tensors, recorded from the packaged file by `python3 -m tests.test_qwen_tokenizer OUT`.
The export reads it as it reads the whole file (export.stream_source.gguf_meta_folder)."""

import lzma
import shutil
import sys
from pathlib import Path

import pytest

from edge.model.tokenizer import end_of_generation_ids
from edge.model.tokenizer import encode, load_tokenizer
from export.stream_source import gguf_meta_folder
from tests.conftest import ROOT

RECORDED = ROOT / "tests" / "data" / "Qwen2.5-Coder-0.5B-Instruct.gguf.xz"
# Qwen2.5's special tokens by id (its tokenizer_config.json): EOS is <|im_end|>, end of text apart; the coder's
# fill-in-the-middle pad, repository name and file separator end a file
END_OF_TEXT, IM_START, IM_END, FIM_PAD, REPO_NAME, FILE_SEP = 151643, 151644, 151645, 151662, 151663, 151664


@pytest.fixture(scope="module")
def qwen_tokenizer(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen-tokenizer")
    gguf = root / RECORDED.name.removesuffix(".xz")
    with lzma.open(RECORDED) as src, open(gguf, "wb") as dst:
        shutil.copyfileobj(src, dst)
    with pytest.MonkeyPatch.context() as m:
        m.setenv("BITNEST_CACHE", str(root / "cache"))
        return load_tokenizer(gguf_meta_folder(gguf))


def test_end_of_text_ends_a_raw_qwen_completion(qwen_tokenizer):
    """A raw completion that writes <|endoftext|> (as a base or coder model does once its text is done) stops there,
    though the tokenizer's EOS is <|im_end|>: the generation loop stops on end_of_generation_ids (edge.llm.LLM adds
    them to the runtime's EOS set, tests/test_serve_adversarial.py checks it on the default model)."""
    tok = qwen_tokenizer
    assert len(tok) == 151936 and tok.eos_token_id == IM_END
    stops = end_of_generation_ids(tok)
    assert stops == {END_OF_TEXT, IM_END, FIM_PAD, REPO_NAME, FILE_SEP}
    written = encode(tok, "def add(a, b):\n    return a + b\n<|endoftext|>", chat=False)
    assert written[-1] == END_OF_TEXT and not set(written[:-1]) & stops     # the text before it never stops early
    assert IM_START not in stops


def test_a_chat_turn_ends_at_im_end(qwen_tokenizer):
    """The chat template closes every turn with <|im_end|>: the assistant's turn ends where the template says."""
    ids = encode(qwen_tokenizer, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    assert ids.count(IM_END) >= 2 and IM_END in end_of_generation_ids(qwen_tokenizer)


def record(out: Path) -> None:
    """Write the packaged Qwen2.5-Coder-0.5B GGUF's metadata, without tensors, to `out` (xz-compressed)."""
    import gguf

    from edge.analysis.bench.peers import _copy_field
    from edge.model.packaged import packaged_gguf
    src = gguf.GGUFReader(str(packaged_gguf("qwen2.5-coder-0.5b")))
    plain = out.with_suffix("")
    w = gguf.GGUFWriter(str(plain), str(bytes(src.fields["general.architecture"].parts[-1]), "utf-8"))
    for field in src.fields.values():
        if not field.name.startswith("GGUF.") and field.name != "general.architecture":
            _copy_field(w, field)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(plain, "rb") as f, lzma.open(out, "wb", preset=9) as dst:
        shutil.copyfileobj(f, dst)
    plain.unlink()


if __name__ == "__main__":
    record(Path(sys.argv[1]))
