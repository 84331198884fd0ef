"""Calibration token windows from ShareGPT (chat-formatted, conversations before the evaluation range)."""

import torch

from edge.corpora import SHAREGPT_EVAL_START, sharegpt_conversations


def calibration_windows(tokenizer, samples: int, seq_len: int) -> torch.Tensor:
    """[samples, seq_len] token ids: chat-formatted ShareGPT conversations from the front, concatenated
    and cut into windows. Never reads the held-out range used by evaluation."""
    need = samples * seq_len
    ids: list[int] = []
    for index, conv in enumerate(sharegpt_conversations(0)):
        if index >= SHAREGPT_EVAL_START or len(ids) >= need:
            break
        conv = [dict(t, content=t["content"][:4000]) for t in conv[:6]]
        ids.extend(tokenizer.apply_chat_template(conv, tokenize=True, return_dict=False))
    if len(ids) < need:
        raise ValueError(f"only {len(ids)} calibration tokens available, {need} requested")
    return torch.tensor(ids[:need], dtype=torch.long).view(samples, seq_len)
