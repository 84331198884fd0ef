"""The runners of `bitnest bench`, each living alone in its worker process (edge.analysis.bench.process): a decoding
policy on a checkpoint, a synthetic checkpoint of a real model's shapes (target or draft AR, or speculation replayed
from recorded rounds), llama.cpp on a GGUF, transformers float32, and the read probe. A runner sets the run's thread
count before anything loads, loads its model once and warms up before the first timed repeat; `run` is one repeat
over every prompt, every generation exactly `max_new_tokens` tokens (EOS ignored)."""

import statistics
import time
from pathlib import Path

import torch

from edge.engine.stats import draft_head_summary

PASS_WIDTHS = tuple(range(1, 9))
WARMUP_TOKENS = 8


def pass_times(eng, prompt: list[int], widths=PASS_WIDTHS, repeats: int = 15) -> dict:
    """Median ms of one pass of W tokens per view, after `prompt` (real passes at its end, not committed): how a
    pass's cost grows with its width, which decides what a verification costs against a single-token step. The
    repeats are sweeps over every (view, width), so a change in the machine's speed while they run (a neighbour's
    memory traffic on a shared host) falls on every pass alike instead of on the widths timed last."""
    eng.reset("pass-times")
    eng.prefill(prompt)
    views = ("draft", "target")
    for view in views:
        eng.forward(prompt[-1:], view)                     # warm-up
    times = {(view, w): [] for view in views for w in widths}
    for _ in range(repeats):
        for (view, w), samples in times.items():
            ids = (prompt * w)[-w:]
            t0 = time.perf_counter()
            eng.forward(ids, view)
            samples.append(time.perf_counter() - t0)
    out = {view: {str(w): round(statistics.median(times[view, w]) * 1e3, 2) for w in widths} for view in views}
    return {"context": len(prompt), "repeats": repeats, "ms": out}


def prefill_times(eng, tokens: int, repeats: int = 3) -> dict:
    """Median seconds of a prefill of `tokens` token ids into an empty cache (the engine's own chunks, the target
    view, the last token's logits only), and the tok/s that gives: what a prompt costs before the first new token."""
    vocab = eng.ckpt.config.vocab_size
    ids = [100 + (7 * i) % (vocab - 100) for i in range(tokens)]
    times = []
    for _ in range(repeats + 1):                           # the first is a warm-up of this length's workspace
        eng.reset("prefill-times")
        t0 = time.perf_counter()
        eng.prefill(ids)
        times.append(time.perf_counter() - t0)
    s = statistics.median(times[1:])
    return {"tokens": tokens, "repeats": repeats, "seconds": round(s, 4), "tok_s": round(tokens / s, 2),
            "seconds_samples": [round(t, 4) for t in times[1:]]}


def _recording(eng, rounds: list) -> None:
    """Record every speculative round's [drafted, accepted] per generation into `rounds` (one list per reset), as
    the generation loop reports them to the stats (edge.decode.generate): the real model's acceptance sequence
    that a replay at another shape follows."""
    reset = eng.reset

    def recorded_reset(policy: str = ""):
        stats = reset(policy)
        record, mine = stats.record_round, []
        rounds.append(mine)

        def record_round(drafted: int, accepted: int) -> None:
            mine.append([drafted, accepted])
            record(drafted, accepted)
        stats.record_round = record_round
        return stats
    eng.reset = recorded_reset


STANDARD = {"policy", "backend", "tokens", "acceptance", "tokens_per_round", "escalation_rate", "draft_passes",
            "target_passes", "weight_bytes_per_token", "kv_bytes_per_token", "tok_s", "decode_seconds",
            "prefill_tokens", "prefill_tok_s"}


def _policy_result(summaries: list, rounds: list | None) -> dict:
    """One repeat's merged statistics, the policy's own figures apart (`policy_stats`), recorded rounds if any."""
    from edge.engine.stats import merged_summary
    s = merged_summary(summaries)
    out = {k: s[k] for k in STANDARD if k in s}
    out["policy_stats"] = {k: v for k, v in s.items() if k not in STANDARD and k != "escalated_at"}
    if rounds is not None:
        out["rounds"] = rounds
    return out


class PolicyRunner:
    """One policy of this runtime on a real checkpoint."""

    OPS = ("run", "pass_times")

    def __init__(self, checkpoint: str, backend: str, policy: str, gamma: int, max_new_tokens: int, prompts: list,
                 max_context: int, gamma_room: int, gate: dict, adaptive: dict, record_rounds: bool = False,
                 draft_head: str | None = None, shortlist_k: int | None = None, draft_vocab: int | None = None,
                 stop_at_eos: bool = False):
        from edge.analysis.calibrate import calibrated_gate
        from edge.decode.adaptive import AdaptiveConfig
        from edge.decode.config import GateConfig, GenerateConfig
        from edge.llm import LLM
        self.rt = LLM(checkpoint, policy="target", backend=backend, max_context=max_context, gamma=gamma_room,
                      draft_head=draft_head, shortlist_k=shortlist_k, draft_vocab=draft_vocab, meter="none")
        self.prompts, self.rounds = prompts, [] if record_rounds else None
        self.stop_at_eos = stop_at_eos           # the runtime's EOS set ends a generation (else every one runs n)
        gate_cfg = calibrated_gate(self.rt, policy, GateConfig(**gate))
        self.cfg = GenerateConfig(policy=policy, gamma=gamma, max_new_tokens=max_new_tokens, gate=gate_cfg,
                                  adaptive=AdaptiveConfig(**adaptive))
        self._generate(self.prompts[0], WARMUP_TOKENS)
        if self.rounds is not None:
            _recording(self.rt.engine, self.rounds)
        self.info = {"backend": self.rt.backend, "isa": getattr(self.rt.engine, "isa", None),
                     "engine_threads": getattr(self.rt.engine, "threads", None), **draft_head_summary(self.rt.ckpt)}

    def _generate(self, prompt: list[int], n: int):
        """(new token ids, statistics)."""
        from dataclasses import replace

        from edge.decode.generate import generate
        eos = self.rt.eos if self.stop_at_eos else set()
        return generate(self.rt.engine, prompt, replace(self.cfg, max_new_tokens=n), eos=eos)

    def run(self) -> dict:
        """One repeat's statistics, with a digest of each prompt's new token ids (`outputs`): what the bench holds
        against the target's, so a speed figure of a policy that stopped being lossless cannot pass unseen."""
        import hashlib
        if self.rounds is not None:
            self.rounds.clear()
        done = [self._generate(p, self.cfg.max_new_tokens) for p in self.prompts]
        out = _policy_result([s for _, s in done], None if self.rounds is None else list(self.rounds))
        out["outputs"] = [hashlib.sha256(str(ids).encode()).hexdigest()[:16] for ids, _ in done]
        return out

    def pass_times(self, repeats: int = 15) -> dict:
        return pass_times(self.rt.engine, self.prompts[0], repeats=repeats)


class SyntheticRunner:
    """A synthetic nested checkpoint of `config`'s shapes (edge.memory.synthetic: random planes, built in this
    process, with a default export's online R1 and R4 of the `r4` layout) on a backend: `mode` target or draft (AR),
    or replay (speculation at γ following recorded rounds); a cache of at least `min_capacity` positions (a long
    prefill's)."""

    OPS = ("run", "pass_times", "prefill_times")

    def __init__(self, config: dict, backend: str, mode: str, max_new_tokens: int, prompts: list, gamma: int,
                 rounds: list | None = None, seed: int = 0, draft_head: str | None = None,
                 shortlist_k: int | None = None, draft_vocab: int | None = None, r4: str = "online",
                 min_capacity: int = 0):
        from edge.backends import make_engine, resolve_backend
        from edge.engine import draft_slots
        from edge.memory.synthetic import synthetic_checkpoint, with_online_rotations
        from edge.model.arch import ModelConfig
        from edge.model.checkpoint import set_draft_head
        from edge.model.draft_head import DRAFT_HEAD_SOURCE_DEFAULT
        if mode not in ("target", "draft", "replay"):
            raise ValueError(f"unknown synthetic mode {mode!r}")
        if mode == "replay" and (not rounds or len(rounds) != len(prompts)):
            raise ValueError("a replay needs one recorded list of rounds per prompt")
        cfg = ModelConfig.from_dict(config)
        self.backend = resolve_backend(backend)
        # the head as an export of a model from its own files writes it: nested, the embedding read from it, the
        # draft reading it as DRAFT_HEAD_SOURCE_DEFAULT (or as asked)
        ckpt = set_draft_head(synthetic_checkpoint(cfg, "cpu", seed=seed, head_nested=True,
                                                   draft_head=DRAFT_HEAD_SOURCE_DEFAULT),
                              draft_head, shortlist_k, draft_vocab)
        ckpt = with_online_rotations(ckpt, r4, seed)
        capacity = max(max(len(p) for p in prompts) + max(max_new_tokens, WARMUP_TOKENS) + gamma + 2, min_capacity)
        self.eng = make_engine(self.backend, ckpt, capacity, scratch=draft_slots(gamma))
        self.mode, self.prompts, self.rounds, self.n = mode, prompts, rounds, max_new_tokens
        self._one(0, WARMUP_TOKENS)
        rot = ckpt.rotations
        self.info = {"backend": self.backend, "isa": getattr(self.eng, "isa", None),
                     "engine_threads": getattr(self.eng, "threads", None), **draft_head_summary(ckpt),
                     "r4_factors": None if rot.r4_factors is None else list(rot.r4_factors),
                     "target_bytes": self.eng.pass_weight_bytes["target"] + self.eng.token_weight_bytes["target"]}

    def _one(self, i: int, n: int):
        from edge.analysis.bench.replay import replay_generation
        from edge.decode.config import GenerateConfig
        from edge.decode.generate import generate
        if self.mode == "replay":
            return replay_generation(self.eng, self.prompts[i], self.rounds[i], n)
        return generate(self.eng, self.prompts[i], GenerateConfig(policy=self.mode, max_new_tokens=n), eos=set())[1]

    def run(self) -> dict:
        return _policy_result([self._one(i, self.n) for i in range(len(self.prompts))], None)

    def pass_times(self, repeats: int = 15) -> dict:
        return pass_times(self.eng, self.prompts[0], repeats=repeats)

    def prefill_times(self, tokens: int, repeats: int = 3) -> dict:
        return prefill_times(self.eng, tokens, repeats)


class LlamaRunner:
    """llama.cpp (xllamacpp's in-process server) on one GGUF, greedy chat completions of the prompts' texts. Its
    weights are read into the process's memory (no mmap), as this runtime's are: file pages of a mapped GGUF are the
    kernel's to drop under memory pressure, and a token that pages its weights back in from disk measures the disk."""

    OPS = ("run",)

    def __init__(self, gguf: str, threads: int, texts: list[str], max_new_tokens: int, n_ctx: int = 2048,
                 draft: str | None = None, draft_max: int = 4):
        from edge.analysis.bench.peers import LlamaCpp
        self.llama = LlamaCpp(Path(gguf), threads, n_ctx, mmap=False, draft=draft and Path(draft), draft_max=draft_max)
        self.n = max_new_tokens
        self.messages = [[{"role": "user", "content": t}] for t in texts]
        self.llama.decode(self.messages[0], WARMUP_TOKENS)
        self.info = {"gguf": Path(gguf).name, "mmap": self.llama.mmap, "system_info": self.llama.system_info,
                     **({"draft_gguf": Path(draft).name, "draft_max": draft_max} if draft else {})}

    def run(self) -> dict:
        done, drafted, accepted = [], 0, 0
        for m in self.messages:
            done.append(self.llama.decode(m, self.n))
            drafted += self.llama.timings.get("draft_n", 0)
            accepted += self.llama.timings.get("draft_n_accepted", 0)
        tokens, seconds = sum(d[0] for d in done), sum(d[1] for d in done)
        out = {"tok_s": round(tokens / seconds, 2), "tokens": tokens}
        return out if not drafted else {**out, "acceptance": round(accepted / drafted, 4), "drafted": drafted}


class NativeLlamaRunner:
    """llama.cpp built for this CPU (edge.analysis.bench.llamacpp) on one GGUF: each repeat two `llama-bench`
    processes, a pp test of the prompts' median length from an empty cache, and a tg test of `max_new_tokens` after
    that many cached positions (random token ids, no sampler: bare passes, as this runtime's decode after its prompt;
    a tg from an empty cache would attend over fewer positions than ours)."""

    OPS = ("run",)

    def __init__(self, gguf: str, threads: int, prompt_tokens: int, max_new_tokens: int, cache: str):
        from edge.analysis.bench.llamacpp import binary
        self.tool = binary(Path(cache))
        if self.tool is None:
            raise RuntimeError("no native llama.cpp build: edge.analysis.bench.llamacpp.ensure_built runs first")
        self.gguf, self.threads, self.p, self.n = Path(gguf), threads, prompt_tokens, max_new_tokens
        self.info = {"gguf": self.gguf.name, "native": True}

    def run(self) -> dict:
        from edge.analysis.bench.llamacpp import llama_bench, system_info, test_rate
        pp = test_rate(llama_bench(self.tool, self.gguf, self.threads, prompt=self.p), "pp")
        records = llama_bench(self.tool, self.gguf, self.threads, gen=self.n, depth=self.p)
        tg = test_rate(records, "tg")
        return {"tok_s": tg["tok_s"], "tokens": tg["tokens"], "tg_depth": self.p, "prefill_tokens": pp["tokens"],
                "prefill_tok_s": pp["tok_s"], "system_info": system_info(records)}


class HfRunner:
    """transformers' greedy `generate`, float32, on the checkpoint's source (an HF folder, or a GGUF file that
    transformers dequantizes itself): decode tok/s as (time for n new tokens - time for 1) / (n - 1), summed over
    prompts."""

    OPS = ("run",)

    def __init__(self, folder: str, prompts: list, max_new_tokens: int, gguf: str | None = None):
        from transformers import AutoModelForCausalLM
        where = dict(pretrained_model_name_or_path=str(Path(gguf).parent), gguf_file=Path(gguf).name) if gguf \
            else dict(pretrained_model_name_or_path=folder)
        self.model = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32).eval()
        self.prompts, self.n = prompts, max_new_tokens
        self._generate(self.prompts[0], 2)
        self.info = {}

    def _generate(self, ids: list[int], n: int) -> float:
        kw = dict(do_sample=False, pad_token_id=self.model.config.eos_token_id)
        t0 = time.perf_counter()
        with torch.no_grad():
            self.model.generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, **kw)
        return time.perf_counter() - t0

    def run(self) -> dict:
        seconds = sum(self._generate(p, self.n) - self._generate(p, 1) for p in self.prompts)
        return {"tok_s": round(len(self.prompts) * (self.n - 1) / seconds, 2)}


class ProbeRunner:
    """The read probe (edge.analysis.bench.peers.ReadProbe) of `nbytes`."""

    OPS = ("run",)

    def __init__(self, nbytes: int, repeats: int = 5):
        from edge.analysis.bench.peers import ReadProbe
        self.probe, self.repeats = ReadProbe(nbytes), repeats
        self.probe.gbps(1)
        self.info = {"bytes": self.probe.nbytes}

    def run(self) -> dict:
        return {"gbps": round(self.probe.gbps(self.repeats), 2)}


RUNNERS = {"policy": PolicyRunner, "synthetic": SyntheticRunner, "llamacpp": LlamaRunner,
           "llamacpp_native": NativeLlamaRunner, "hf": HfRunner, "probe": ProbeRunner}


def make_runner(spec: dict):
    """The runner `spec["kind"]` names, built from the rest of `spec` after torch takes the run's thread count."""
    spec = dict(spec)
    kind, threads = spec.pop("kind"), spec.pop("threads")
    torch.set_num_threads(threads)            # before any engine: the native step takes torch's count as its own
    if kind in ("llamacpp", "llamacpp_native"):   # the peers take the count as an argument of their own
        spec["threads"] = threads
    runner = RUNNERS[kind](**spec)
    runner.info = {"kind": kind, "threads": threads, **runner.info}
    return runner
