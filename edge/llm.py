"""The Python API (`from edge import LLM`) and the one object every front end drives (`bitnest chat`, `bitnest
serve`): a checkpoint loaded once with its engine, tokenizer, the auto policy's pass costs and a power meter; answers
to chat messages or raw text, blocking or streamed, one generation at a time on the engine, with stop strings held
back from a stream and a generation cancelled at its next round."""

import queue
import threading
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Optional

from edge.decode.config import GenerateConfig
from edge.decode.generate import CONTEXT_FULL
from edge.decode.registry import most_proposals
from edge.decode.sampling import SamplingConfig
from edge.decode.stats import DecodeStats
from edge.decode.thresholds import resolve_gate
from edge.energy.session import EnergySession
from edge.errors import BitNestError
from edge.model.checkpoint import WEIGHTS_BASE, WEIGHTS_NESTED, check_weights
from edge.runtime import Runtime, check_policy

STOP, LENGTH, CANCELLED = "stop", "length", "cancelled"     # finish reasons (OpenAI's names, and ours)
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


def default_policy(weights: str = WEIGHTS_NESTED) -> str:
    """The policy a front end runs unless told: `auto`, or `draft` (the only one) on base-plane weights."""
    return "draft" if weights == WEIGHTS_BASE else "auto"


def end_of_generation_ids(tokenizer) -> set[int]:
    """The ids that end a generation by the tokenizer's own metadata: its EOS, and every token it marks special
    whose text is one of END_OF_GENERATION."""
    ids = {i for i, t in tokenizer.added_tokens_decoder.items() if t.special and t.content in END_OF_GENERATION}
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


class ContextTooLong(BitNestError):
    """A request whose prompt plus its token limit needs more positions than the engine holds."""


@dataclass
class Answer:
    """One generation: its text (stop string and what follows cut off, the stop token left out), every new token
    id (the prefill's first included, the stop token too where one ended it), the prompt's length, why it ended
    (stop, length, cancelled) and its counters (`stats.extra`: the engine's description and the energy figures)."""

    text: str
    tokens: list[int]
    prompt_tokens: int
    finish_reason: str
    stats: DecodeStats

    def summary(self) -> dict:
        """The chat's statistics of this answer (docs/runtime.md metric names, J/token or null with its reason)."""
        return self.stats.summary()


class HeldText:
    """The text deltas a stream may send: a tail that could begin a stop string, or an unfinished character at the
    end (U+FFFD from a partial byte sequence), waits for the next tokens; a U+FFFD with text after it is the model's
    own and goes out; a stop string and what follows never go out. `finish(text)` sends what the final text holds
    beyond what was sent."""

    def __init__(self, stops: tuple[str, ...], emit: Callable[[str], None]):
        self.stops, self.emit = tuple(s for s in stops if s), emit
        self.text, self.sent, self.stopped = "", 0, False

    def feed(self, delta: str) -> None:
        if self.stopped:
            return
        self.text += delta
        cut = len(self.text)
        hits = [i for i in (self.text.find(s) for s in self.stops) if i >= 0]
        if hits:
            cut, self.stopped = min(hits), True
        else:
            for s in self.stops:     # the longest tail that is a proper prefix of a stop string
                k = next((k for k in range(min(len(s) - 1, cut), 0, -1) if self.text.endswith(s[:k])), 0)
                cut = min(cut, len(self.text) - k)
            cut = min(cut, len(self.text.rstrip("\ufffd")))     # an unfinished character at the very end
        self._send(cut)

    def finish(self, final: str) -> None:
        if final.startswith(self.text[:self.sent]):
            self.text, self.stopped = final, True
            self._send(len(final))

    def _send(self, cut: int) -> None:
        if cut > self.sent:
            self.emit(self.text[self.sent:cut])
            self.sent = cut


class LLM:
    """A nested checkpoint loaded once. `chat(messages)` / `complete(text)` answer; `stream(messages)` iterates
    over the answer's text deltas; `generate(ids)` is the core both use (and the server, on its engine thread).

    `weights` `base` loads the base planes only (never reading the refinement planes: the 4-bit model), which runs
    the `draft` policy alone (`policy` None: auto, or draft on base weights; a policy that needs the target is
    refused in one line before loading).
    `config` holds every setting but the per-call ones (default: `policy` with the library's defaults); calls may
    override `max_tokens`, `temperature`, `top_p`, `seed` and `stop`. `max_context` None: 2048 positions, or with a
    `device` profile the largest context its memory plan fits. `meter`: a meter name (edge.energy.METERS), a
    started meter, or a function that starts one (called once the model is loaded). `on_note` receives one line
    where the auto policy's cached cost table was refused. `kv_window`: elastic KV (edge.runtime.Runtime): N >= 1
    reads KV8 for each query's last N positions only; None: only where `max_context` passes the device's KV8 plan;
    0: never."""

    def __init__(self, checkpoint, *, policy: Optional[str] = None, config: Optional[GenerateConfig] = None,
                 backend: str = "auto", max_context: Optional[int] = None, device: Optional[str] = None,
                 draft_head: Optional[str] = None, shortlist_k: Optional[int] = None, meter="auto",
                 energy_log=None, idle_seconds: float = 0.0, remeasure_costs: bool = False,
                 on_note: Optional[Callable[[str], None]] = None, kv_window: Optional[int] = None,
                 weights: str = WEIGHTS_NESTED, draft_vocab: Optional[int] = None):
        cfg = config if config is not None else GenerateConfig(policy=policy or default_policy(weights))
        check_policy(cfg.policy, check_weights(weights))         # before minutes of loading
        rt = Runtime(checkpoint, backend=backend, max_context=max_context or (None if device else 2048),
                     scratch=max(8, most_proposals(cfg) + 1), device=device, draft_head=draft_head,
                     shortlist_k=shortlist_k, kv_window=kv_window, weights=weights,
                     draft_vocab=draft_vocab)
        rt.eos |= end_of_generation_ids(rt.tokenizer)     # the config's EOS and the tokenizer's end-of-generation set
        self.runtime = rt
        self.config = replace(cfg, gate=resolve_gate(rt.ckpt, rt.backend, cfg.policy, cfg.gate))
        if cfg.policy == "auto":      # the pass costs before the first answer (read from the cache, or timed once)
            note = rt.cost_table(remeasure=remeasure_costs).note
            if note and on_note is not None:
                on_note(note)
        # the meter starts once the model is loaded: samples of the loading would pass for idle power
        if isinstance(meter, str):
            from edge.energy import make_meter
            meter = make_meter(meter)
        elif callable(meter) and not hasattr(meter, "mark"):
            meter = meter()
        try:
            self.energy = EnergySession(meter, energy_log, idle_seconds)
        except BaseException:
            meter.stop()
            raise
        self.energy.attach(rt.engine)
        self._lock = threading.Lock()       # one generation at a time on the engine

    # -- what the model is --------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """KV cache positions: the most a prompt plus its new tokens may take."""
        return self.runtime.engine.capacity

    @property
    def name(self) -> str:
        """The model's name: its checkpoint folder's."""
        return self.runtime.ckpt.path.name

    def encode(self, prompt, chat: bool = True) -> list[int]:
        """Token ids of chat messages (or a str as one user turn) through the chat template, or of raw text."""
        return self.runtime.encode(prompt, chat)

    def check_fits(self, prompt_tokens: int, max_tokens: int) -> None:
        """Refuse, before any work, a request that needs more positions than the engine holds (with a device
        profile, than its memory plan allocated)."""
        need = prompt_tokens + max_tokens
        if need > self.capacity:
            plan = self.runtime.plan
            held = f"the memory plan for {plan.device.name} allocates" if plan is not None else "the KV cache holds"
            raise ContextTooLong(f"the request needs {need} positions ({prompt_tokens} in the prompt + {max_tokens} "
                                 f"new tokens) but {held} {self.capacity}: shorten the prompt or lower max_tokens")

    def settings(self, max_tokens: Optional[int] = None, temperature: Optional[float] = None,
                 top_p: Optional[float] = None, seed: Optional[int] = None,
                 top_k: Optional[int] = None) -> GenerateConfig:
        """The generation settings of one call: the LLM's, with the given ones in place."""
        c = self.config
        s = c.sampling
        sampling = SamplingConfig(s.temperature if temperature is None else temperature,
                                  s.top_k if top_k is None else top_k, s.top_p if top_p is None else top_p,
                                  s.seed if seed is None else seed)
        return replace(c, sampling=sampling, max_new_tokens=c.max_new_tokens if max_tokens is None else max_tokens)

    # -- answers ------------------------------------------------------------------------------------------
    def generate(self, prompt_ids: list[int], *, max_tokens: Optional[int] = None,
                 temperature: Optional[float] = None, top_p: Optional[float] = None, seed: Optional[int] = None,
                 stop=(), on_text: Optional[Callable[[str], None]] = None,
                 cancelled: Optional[Callable[[], bool]] = None, config: Optional[GenerateConfig] = None) -> Answer:
        """One metered answer after `prompt_ids`. `on_text` receives the text deltas (stop strings held back);
        `cancelled()` true ends the generation at its next round (finish reason `cancelled`). With stop strings the
        text goes through HeldText even without `on_text`: a stop string found in the text so far, however many
        tokens it spans, ends the generation at its next round too (the runtime's own check reads its last 16)."""
        cfg = config if config is not None else self.settings(max_tokens, temperature, top_p, seed)
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        held = HeldText(stops, on_text or (lambda delta: None)) if on_text is not None or stops else None
        ended = cancelled if held is None or not stops else lambda: held.stopped or (cancelled is not None and
                                                                                   cancelled())
        with self._lock:
            r, figures = self.energy.answer(lambda on_tokens: self.runtime.generate(
                prompt_ids, cfg, stops, on_text=held.feed if held else None, on_tokens=on_tokens,
                cancelled=ended))
        stats = r["stats"]
        stats.extra.update(figures)
        tokens = r["tokens"]
        if cancelled is not None and cancelled():
            reason = CANCELLED
        elif tokens and tokens[-1] in self.runtime.eos:
            reason = STOP
        elif stats.extra.get("stopped") == CONTEXT_FULL or len(tokens) >= cfg.max_new_tokens and not \
                any(s in self.runtime.tokenizer.decode(tokens, skip_special_tokens=True) for s in stops):
            reason = LENGTH
        else:
            reason = STOP
        if held is not None:
            held.finish(r["text"])
        return Answer(r["text"], tokens, len(prompt_ids), reason, stats)

    def chat(self, messages, **kw) -> Answer:
        """The answer to chat messages ([{"role", "content"}], or a str as one user turn)."""
        return self.generate(self.encode(messages), **kw)

    def complete(self, text: str, **kw) -> Answer:
        """The continuation of raw text (no chat template)."""
        return self.generate(self.encode(text, chat=False), **kw)

    def stream(self, messages, chat: bool = True, **kw) -> "Stream":
        """An iterator over the answer's text deltas (generated on a thread of its own); its `answer` once done."""
        return Stream(self, self.encode(messages, chat), kw)

    def energy_failure(self) -> Optional[str]:
        """The reason the power meter stopped, the first time it is asked after it did (None otherwise)."""
        return self.energy.failure()

    def close(self) -> None:
        """Stop the power meter (the engine goes with the object)."""
        self.energy.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_END = object()


class Stream:
    """Text deltas of one answer as they are generated. Leaving early (`close()`, or a `with` block) ends the
    generation at its next round; `answer` holds the Answer once the iteration is over."""

    def __init__(self, llm: LLM, ids: list[int], kw: dict):
        self._queue: queue.Queue = queue.Queue()
        self._cancel = threading.Event()
        self.answer: Optional[Answer] = None

        def run():
            try:
                self.answer = llm.generate(ids, on_text=self._queue.put, cancelled=self._cancel.is_set, **kw)
                self._queue.put(_END)
            except BaseException as e:      # raised again in the iterating thread
                self._queue.put(e)

        self._thread = threading.Thread(target=run, name="bitnest-stream", daemon=True)
        self._thread.start()

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        item = self._queue.get()
        if item is _END:
            self._queue.put(_END)           # stays exhausted
            raise StopIteration
        if isinstance(item, BaseException):
            self._queue.put(item)
            raise item
        return item

    def close(self) -> None:
        self._cancel.set()
        self._thread.join()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
