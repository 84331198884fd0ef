"""Prompt sources of the lossless check: the coding requests (edge.corpora.code_prompts) from the held-out ShareGPT
range, apart from the chat requests."""

from edge.corpora import CODE_REQUEST, CODE_REQUEST_VERB, code_prompts, sharegpt_prompts


def test_coding_requests_are_real_held_out_requests_apart_from_the_chat_ones():
    code = code_prompts(8)
    assert len(set(code)) == 8 and all(CODE_REQUEST.search(t) and CODE_REQUEST_VERB.search(t) for t in code)
    assert not set(code) & set(sharegpt_prompts(12))
    assert code_prompts(0) == [] and code_prompts(3) == code[:3]
