"""Streaming text (edge.text_stream, used by Runtime.generate): the streamed pieces, concatenated, equal the final
text on long answers whose tokens split multi-byte characters, and the stream decodes each token a bounded number
of times (the chat used to decode the whole answer again at every new token); an answer is cut at a stop string
where a token-by-token decode would have ended it."""

import random

import pytest

from edge.decode.config import GenerateConfig
from edge.decode.sampling import SamplingConfig
from edge.llm import Runtime
from edge.model.tokenizer import load_tokenizer
from edge.text_stream import TextStream, cut_at_stop

# Real text with characters of 2, 3 and 4 UTF-8 bytes, which SmolLM2's byte-level tokens split across tokens.
TEXT = ("To be, or not to be, that is the question: naïve café owners in Zürich — “quoted” — 東京と大阪の天気は晴れ。"
        " Emoji 😀👍🏽🇫🇷 and math ∑ ∫ ≈ ≠ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢; Ελληνικά, русский, العربية, हिन्दी. ")


@pytest.fixture(scope="module")
def tokenizer(default_model):
    return load_tokenizer(default_model.tokenizer_files()[0].parent)


def streamed(decode, ids: list[int], rng: random.Random) -> list[str]:
    """The pieces a TextStream gives for `ids` arriving 1..5 at a time (as speculative rounds deliver them)."""
    s, out, i = TextStream(decode), [], 0
    while i < len(ids):
        n = rng.randint(1, 5)
        out.append(s.push(ids[i:i + n]))
        i += n
    return out + [s.finish()]


def test_streamed_text_equals_the_final_text_and_decoding_is_linear(tokenizer):
    ids = tokenizer(TEXT * 4)["input_ids"]
    assert len(ids) >= 300
    split = [t for t in ids if "\ufffd" in tokenizer.decode([t])]
    assert len(split) >= 20, "the text should hold tokens that are parts of a character"
    decoded = [0]

    def decode(window: list[int]) -> str:
        decoded[0] += len(window)
        return tokenizer.decode(window, skip_special_tokens=True)
    for seed in range(3):
        decoded[0] = 0
        pieces = streamed(decode, ids, random.Random(seed))
        assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True), seed
        assert not any(p.endswith("\ufffd") for p in pieces), "a split character was shown before its last byte"
        # every token is decoded in at most a few windows; re-decoding the answer would be ~len(ids)^2 / 6
        assert decoded[0] <= 8 * len(ids), (decoded[0], len(ids))


def test_a_long_generated_answer_streams_exactly_its_text(small_llama_checkpoint):
    """A 2-layer model with random weights, sampling: 200 tokens of every kind, byte tokens among them (many that
    never complete a character: the decoder writes U+FFFD for those, the stream must write the same)."""
    rt = Runtime(small_llama_checkpoint, backend="cpu", max_context=512)
    pieces, decoded, real = [], [0], rt.tokenizer.decode

    def decode(ids, **kw):                   # the real tokenizer's decode, counting the token ids it is given
        decoded[0] += len(ids)
        return real(ids, **kw)
    rt.tokenizer.decode = decode
    cfg = GenerateConfig(policy="speculative", max_new_tokens=200, sampling=SamplingConfig(temperature=1.0, seed=3))
    r = rt.generate(rt.encode("Write a long story."), cfg, on_text=pieces.append)
    n = len(r["tokens"])
    assert n >= 200, n
    assert "".join(pieces) == r["text"] and len(pieces) >= 20
    assert decoded[0] <= 6 * n, (decoded[0], n)    # ~4n measured; decoding the answer again each round: ~n^2 / 9


def test_an_answer_is_cut_where_a_token_by_token_decode_ends_it(tokenizer):
    """Tokens through the one that completes the first stop string to complete (a speculative round's tokens past
    it dropped), text before that stop string: a long one that begins earlier but completes later does not cut
    the text sooner; a stop string split inside a multi-byte character; none, nothing cut."""
    ids = tokenizer(TEXT)["input_ids"]
    decode = tokenizer.decode
    text = decode(ids)
    for stops, at in ((("question",), "question"), (("not to be, that is the question", "that"), "that"),
                      (("大阪",), "大阪"), (("東京と大阪の天気は晴れ。 Emoji 😀", "天気"), "天気")):
        tokens, cut, stopped = cut_at_stop(ids, decode, stops)
        n = len(tokens)
        assert stopped and tokens == ids[:n] and cut == text[:text.index(at)], (stops, cut)
        assert at in decode(ids[:n]) and not any(s in decode(ids[:n - 1]) for s in stops), (stops, n)
    assert cut_at_stop(ids, decode, ("no such text",)) == (ids, text, False)
    assert cut_at_stop(ids, decode, ()) == (ids, text, False)
