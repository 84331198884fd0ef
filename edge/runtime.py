"""The runtime a user drives: a checkpoint, its tokenizer and chat template, and one engine of a backend
(sized from the memory plan when a device profile is given, elastic KV past what it holds at KV8), turning prompts
into text with streaming and decode statistics."""

import gc
import os
from dataclasses import replace
from pathlib import Path
from typing import Callable, Optional

from edge.backends import make_engine, resolve_backend
from edge.decode.config import GenerateConfig
from edge.decode.cost_table import CostTable
from edge.decode.costs import SAMPLE_TEXT, engine_costs
from edge.decode.generate import generate
from edge.decode.stats import DecodeStats, draft_head_summary, fp16_weight_bytes_per_pass
from edge.memory.devices import release_freed_heap
from edge.decode.registry import policy_class
from edge.errors import BitNestError
from edge.memory.plan import DEFAULT_KV_WINDOW, check_request, elastic_kv, fit_context, plan_for_runtime
from edge.model.checkpoint import WEIGHTS_BASE, WEIGHTS_NESTED, check_weights, load_checkpoint, set_draft_head
from edge.text_stream import TextStream


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


class Runtime:
    """Loads a checkpoint once; `generate` runs one prompt (or a chat history) at a time."""

    def __init__(self, checkpoint, backend: str = "auto", max_context: int | None = 2048, prefill_chunk: int = 256,
                 scratch: int = 17, device: Optional[str] = None, draft_head: Optional[str] = None,
                 shortlist_k: Optional[int] = None, kv_window: Optional[int] = None, weights: str = WEIGHTS_NESTED,
                 draft_vocab: Optional[int] = None):
        """`draft_head` / `shortlist_k` / `draft_vocab` override what the draft reads of a nested head
        (edge.model.draft_head; None: the checkpoint's setting). `kv_window` (elastic KV, docs/memory.md): N >= 1
        runs elastically, each query reading KV8 for its last N positions; None: elastically (window
        DEFAULT_KV_WINDOW) only where `max_context` passes what the device's plan holds at KV8; 0: never. `weights`
        `base` loads the base planes only (edge.model.checkpoint): the 4-bit model, run by the `draft` policy alone
        (no elastic KV)."""
        if kv_window and check_weights(weights) == WEIGHTS_BASE:
            raise BitNestError("--kv-window applies to the 8-bit target's KV reads: drop it with --weights base "
                               "(the draft reads KV4 at long context already)")
        backend = resolve_backend(backend)
        self.ckpt = set_draft_head(load_checkpoint(checkpoint, weights=check_weights(weights)), draft_head, shortlist_k,
                                   draft_vocab)
        self.tokenizer = load_tokenizer(self.ckpt.path)
        scratch = scratch if self.ckpt.has_target else 0        # base planes: the draft policy drafts nothing ahead
        self.plan = None
        window = kv_window or None
        if device is not None:  # allocate from the memory plan (docs/memory.md): max_context None = the largest that fits
            self.plan = plan_for_runtime(self.ckpt, device, backend, prefill_chunk, scratch)   # bitnest or bitnest-base
            if self.ckpt.has_target and kv_window is None and max_context is not None \
                    and 0 < self.plan.max_context < max_context:
                window = DEFAULT_KV_WINDOW     # past the KV8 plan: elastic KV instead of a refusal
            if window is not None:
                self.plan = plan_for_runtime(self.ckpt, device, backend, prefill_chunk, scratch, window)
            base = plan_for_runtime(self.ckpt, device, backend, prefill_chunk, scratch, weights=WEIGHTS_BASE) \
                if self.plan.max_context < 1 and self.ckpt.has_target else None
            max_context = fit_context(self.plan, max_context, base)
        elastic = None if window is None else elastic_kv(window, max_context, backend, prefill_chunk, scratch)
        self.backend = backend
        self.engine = make_engine(backend, self.ckpt, max_context, scratch=scratch, prefill_chunk=prefill_chunk,
                                  elastic=elastic)
        eos = set(self.ckpt.config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos = eos
        self.fp16_bytes_per_token = fp16_weight_bytes_per_pass(self.ckpt)
        # Everything loaded so far (the tokenizer, transformers' modules, the checkpoint) lives as long as the
        # runtime: out of the cyclic collector's generations, so a collection scans only what decoding makes
        # (full collections over the loaded objects took ~5% of a native pass's time, measured with perf). Loading's
        # garbage is collected first (frozen, it would never be) and the heap it freed given back.
        release_freed_heap()
        gc.freeze()

    def encode(self, prompt: str | list[dict], chat: bool = True) -> list[int]:
        """Token ids of a prompt: with `chat`, through the model's chat template (a str is one user turn)."""
        return encode(self.tokenizer, prompt, chat)

    def generate(self, prompt_ids: list[int], cfg: GenerateConfig, stop_strings: tuple[str, ...] = (),
                 on_text: Optional[Callable[[str], None]] = None,
                 on_tokens: Optional[Callable[[list[int]], None]] = None,
                 cancelled: Optional[Callable[[], bool]] = None) -> dict:
        """Generate after `prompt_ids`; stream decoded text deltas to `on_text` (edge.text_stream: each token
        decoded a bounded number of times; concatenated, the text of every token written, stop strings included)
        and new token ids to `on_tokens` (first called with the prefill's token); `cancelled()` true ends the
        generation at its next round. Returns {"text", "tokens", "stats"} with the stop token (EOS) left out of the
        text."""
        check_policy(cfg.policy, self.ckpt.weights)
        if self.plan is not None:
            check_request(self.plan, self.engine.capacity, len(prompt_ids), cfg.max_new_tokens)
        tok = self.tokenizer
        text_stream = TextStream(lambda ids: tok.decode(ids, skip_special_tokens=True))

        def stop(out: list[int]) -> bool:
            return (cancelled is not None and cancelled()) or any(s in tok.decode(out[-16:]) for s in stop_strings)

        def stream(new: list[int]) -> None:
            if on_tokens is not None:
                on_tokens(new)
            if on_text is not None:
                delta = text_stream.push([t for t in new if t not in self.eos])
                if delta:
                    on_text(delta)

        stopping = stop if stop_strings or cancelled is not None else None
        tokens, stats = generate(self.engine, prompt_ids, cfg, self.eos, stopping, stream, decode=tok.decode)
        rest = text_stream.finish() if on_text is not None else ""
        if rest:
            on_text(rest)
        text = tok.decode([t for t in tokens if t not in self.eos], skip_special_tokens=True)
        for s in stop_strings:
            if s in text:
                text = text[: text.index(s)]
        stats.extra.update(self.describe())
        return {"text": text, "tokens": tokens, "stats": stats}

    def cost_table(self, remeasure: bool = False) -> CostTable:
        """The engine's pass costs for the auto policy (edge.decode.costs): kept on the engine, else read from the
        cache, else measured at a context of plain English text (seconds) and saved; `remeasure` measures anew.
        `auto` gets them at its first generation anyway: calling this first moves the measuring out of an answer."""
        return engine_costs(self.engine, self.encode(SAMPLE_TEXT, chat=False), remeasure)

    def describe(self) -> dict:
        return {"activations": self.engine.activations, "weights": self.ckpt.weights,
                "fp16_weight_bytes_per_token": self.fp16_bytes_per_token,
                "method": self.ckpt.method, **draft_head_summary(self.ckpt), **self.engine.numerics()}


def check_policy(policy: str, weights: str) -> None:
    """Refuse, in one line, a policy that runs target-view passes on weights loaded without the refinement planes."""
    if weights == WEIGHTS_BASE and policy_class(policy).needs_target:
        raise BitNestError(f"--weights base loads no refinement planes, and the {policy} policy runs the 8-bit target: "
                           "use --policy draft (the 4-bit model by itself), or --weights nested")


def merged_summary(stats: list[DecodeStats]) -> dict:
    """One summary over several runs (sums of counters, ratios recomputed)."""
    total = replace(stats[0], extra=dict(stats[0].extra))
    for s in stats[1:]:
        total.add(s)
    return total.summary()
