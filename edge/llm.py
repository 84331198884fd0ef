"""The front door: the Python API (`from edge import LLM`) and the one object every front end drives (`bitnest
chat`, `bitnest serve`, the bench and the other tools): a checkpoint loaded once with its engine, tokenizer, the auto
policy's pass costs and a power meter; answers to chat messages or raw text, blocking or streamed, one generation at
a time on the engine, with stop strings held back from a stream and a generation cancelled at its next round.

Loading (Runtime, internal to this module): the checkpoint (edge.model.checkpoint), its tokenizer, the memory plan
where a device profile is given (edge.memory.plan) and one engine of a backend (edge.backends), sized for rounds of
up to γ proposals, γ passed down as γ (edge.engine.draft_slots turns it into KV slots)."""

import gc
import queue
import threading
from dataclasses import dataclass, replace
from typing import Callable, Iterator, Optional

from edge.backends import make_engine, resolve_backend
from edge.decode.config import GenerateConfig
from edge.decode.generate import CONTEXT_FULL, generate
from edge.decode.registry import most_proposals, policy_class
from edge.decode.sampling import SamplingConfig
from edge.decode.thresholds import resolve_gate
from edge.energy.session import EnergySession
from edge.engine import MAX_PROPOSALS, draft_slots
from edge.engine.cost_table import CostTable
from edge.engine.costs import SAMPLE_TEXT, engine_costs
from edge.engine.stats import DecodeStats, draft_head_summary, fp16_weight_bytes_per_pass
from edge.errors import BitNestError
from edge.memory.devices import release_freed_heap
from edge.memory.plan import DEFAULT_KV_WINDOW, check_request, elastic_kv, fit_context, plan_for_runtime
from edge.model.checkpoint import WEIGHTS_BASE, WEIGHTS_NESTED, check_weights, load_checkpoint, set_draft_head
from edge.model.tokenizer import encode, end_of_generation_ids, load_tokenizer
from edge.text_stream import HeldText, TextStream, cut_at_stop, first_stop

STOP, LENGTH, CANCELLED = "stop", "length", "cancelled"     # finish reasons (OpenAI's names, and ours)
GAMMA_ROOM = 7      # the fewest proposals an LLM's cache holds a round of, so a call's config may raise γ that far


def default_policy(weights: str = WEIGHTS_NESTED) -> str:
    """The policy a front end runs unless told: `auto`, or `draft` (the only one) on base-plane weights."""
    return "draft" if weights == WEIGHTS_BASE else "auto"


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


class Runtime:
    """Internal to this module: what LLM loads and drives (front ends, the server and the tools use LLM). A
    checkpoint loaded once with its tokenizer and one engine of a backend, sized from the memory plan when a device
    profile is given (elastic KV past what it holds at KV8); `generate` runs one prompt at a time, unmetered."""

    def __init__(self, checkpoint, backend: str = "auto", max_context: int | None = 2048, prefill_chunk: int = 256,
                 gamma: int = MAX_PROPOSALS, device: Optional[str] = None, draft_head: Optional[str] = None,
                 shortlist_k: Optional[int] = None, kv_window: Optional[int] = None, weights: str = WEIGHTS_NESTED,
                 draft_vocab: Optional[int] = None):
        """`gamma`: the most proposals a round may draft (the cache's scratch slots: edge.engine.draft_slots).
        `draft_head` / `shortlist_k` / `draft_vocab` override what the draft reads of a nested head
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
        gamma = gamma if self.ckpt.has_target else 0        # base planes: the draft policy drafts nothing ahead
        self.plan = None
        window = kv_window or None
        # with a device, allocate from the memory plan (docs/memory.md): max_context None = the largest that fits
        if device is not None:
            self.plan = plan_for_runtime(self.ckpt, device, backend, prefill_chunk, gamma)   # bitnest or bitnest-base
            if self.ckpt.has_target and kv_window is None and max_context is not None \
                    and 0 < self.plan.max_context < max_context:
                window = DEFAULT_KV_WINDOW     # past the KV8 plan: elastic KV instead of a refusal
            if window is not None:
                self.plan = plan_for_runtime(self.ckpt, device, backend, prefill_chunk, gamma, window)
            base = plan_for_runtime(self.ckpt, device, backend, prefill_chunk, gamma, weights=WEIGHTS_BASE) \
                if self.plan.max_context < 1 and self.ckpt.has_target else None
            max_context = fit_context(self.plan, max_context, base)
        elastic = None if window is None else elastic_kv(window, max_context, backend, prefill_chunk, gamma)
        self.backend = backend
        self.engine = make_engine(backend, self.ckpt, max_context, scratch=draft_slots(gamma),
                                  prefill_chunk=prefill_chunk, elastic=elastic)
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
        generation at its next round. Returns {"text", "tokens", "stats", "stopped"} with the stop token (EOS) left
        out of the text; where a stop string occurs, the tokens and text a token-by-token decode ends with there
        (`cut_at_stop`: the tokens through the one that completes it, the text before it) and `stopped` true."""
        check_policy(cfg.policy, self.ckpt.weights)
        if self.plan is not None:
            check_request(self.plan, self.engine.capacity, len(prompt_ids), cfg.max_new_tokens)
        tok = self.tokenizer
        text_stream = TextStream(lambda ids: tok.decode(ids, skip_special_tokens=True))

        def answer_text(ids: list[int]) -> str:
            return tok.decode([t for t in ids if t not in self.eos], skip_special_tokens=True)

        def stop(out: list[int]) -> bool:
            return (cancelled is not None and cancelled()) or \
                first_stop(answer_text(out[-16:]), stop_strings) is not None

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
        tokens, text, stopped = cut_at_stop(tokens, answer_text, stop_strings)
        stats.extra.update(self.describe())
        return {"text": text, "tokens": tokens, "stats": stats, "stopped": stopped}

    def cost_table(self, remeasure: bool = False) -> CostTable:
        """The engine's pass costs for the auto policy (edge.engine.costs): kept on the engine, else read from the
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
    where the auto policy's cached cost table was refused. `kv_window`: elastic KV (Runtime): N >= 1
    reads KV8 for each query's last N positions only; None: only where `max_context` passes the device's KV8 plan;
    0: never. `gamma`: the most proposals a round on this object may draft (None: what its config's policy may,
    at least GAMMA_ROOM; up to MAX_PROPOSALS)."""

    def __init__(self, checkpoint, *, policy: Optional[str] = None, config: Optional[GenerateConfig] = None,
                 backend: str = "auto", max_context: Optional[int] = None, device: Optional[str] = None,
                 draft_head: Optional[str] = None, shortlist_k: Optional[int] = None, meter="auto",
                 energy_log=None, idle_seconds: float = 0.0, remeasure_costs: bool = False,
                 on_note: Optional[Callable[[str], None]] = None, kv_window: Optional[int] = None,
                 weights: str = WEIGHTS_NESTED, draft_vocab: Optional[int] = None, gamma: Optional[int] = None):
        cfg = config if config is not None else GenerateConfig(policy=policy or default_policy(weights))
        check_policy(cfg.policy, check_weights(weights))         # before minutes of loading
        rt = Runtime(checkpoint, backend=backend, max_context=max_context or (None if device else 2048),
                     gamma=gamma or max(GAMMA_ROOM, most_proposals(cfg)), device=device, draft_head=draft_head,
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
    def ckpt(self):
        """The loaded checkpoint (edge.model.checkpoint.Checkpoint)."""
        return self.runtime.ckpt

    @property
    def engine(self):
        """The engine the generations run on (edge.engine.interface.Engine): for tools that drive passes directly."""
        return self.runtime.engine

    @property
    def backend(self) -> str:
        return self.runtime.backend

    @property
    def tokenizer(self):
        return self.runtime.tokenizer

    @property
    def eos(self) -> set[int]:
        """Token ids that end a generation: the config's EOS and the tokenizer's end-of-generation set."""
        return self.runtime.eos

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
        elif r["stopped"] or tokens and tokens[-1] in self.runtime.eos:
            reason = STOP
        elif stats.extra.get("stopped") == CONTEXT_FULL or len(tokens) >= cfg.max_new_tokens:
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
