"""A checkpoint's tokenizer (its folder holds the source model's tokenizer files, read offline): loading it, a
prompt's token ids through the chat template, and the token ids that end a generation."""

import os
from pathlib import Path


def load_tokenizer(folder: Path):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(folder))


def encode(tokenizer, prompt: str | list[dict], chat: bool = True) -> list[int]:
    """Token ids of a prompt: with `chat`, through the model's chat template (a str is one user turn)."""
    if not chat:
        return tokenizer(prompt)["input_ids"]
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


# Texts of special tokens that end a generation besides the model's EOS (llama.cpp's end-of-generation set, its
# issue 9606): end of text, turn or message, and the fill-in-the-middle pad, repository and file separators a code
# model writes once its file is done. Qwen2.5's EOS is <|im_end|> alone: without this a raw completion that writes
# <|endoftext|> runs on to the end of the context.
END_OF_GENERATION = frozenset({
    "<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|end|>", "<end_of_turn>",
    "<EOT>", "_<EOT>", "<end_of_utterance>", "</s>",
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<reponame>",
    "<|file_sep|>",
})


def end_of_generation_ids(tokenizer) -> set[int]:
    """The ids that end a generation by the tokenizer's own metadata: its EOS, and every token it marks special
    whose text is one of END_OF_GENERATION."""
    ids = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special and t.content in END_OF_GENERATION}
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids
