"""The options that make an LLM (edge.llm), shared by `bitnest chat` and `bitnest serve`: checkpoint, backend,
policy and γ, context and device profile, the draft's KV read, the draft head, gates and adaptive speculation,
the power meter and its log; their typed settings, and the LLM they load."""

import argparse
import sys
from typing import Optional

from edge.argtypes import at_least, count, gamma
from edge.backends import BACKENDS
from edge.options.groups import (
    adaptive_config,
    add_draft_head_arguments,
    add_model_argument,
    add_meter_arguments,
    add_policy_arguments,
    draft_head_options,
    gate_config,
    make_meter_from,
)
from edge.decode.auto import AutoConfig
from edge.decode.config import DraftKVPolicy, GenerateConfig
from edge.engine.costs import MAX_GAMMA
from edge.decode.registry import POLICIES
from edge.decode.sampling import SamplingConfig
from edge.llm import LLM, default_policy
from edge.model.checkpoint import WEIGHT_SETS, WEIGHTS_NESTED


def add_llm_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", help="nested checkpoint folder (default: the embedded SmolLM2 export)")
    add_model_argument(p)
    p.add_argument("--backend", default="auto", help=f"{' | '.join(BACKENDS)} (auto: native where it builds, else cpu)")
    p.add_argument("--policy", help=f"{' | '.join(POLICIES)} (default auto: γ chosen each round from this "
                   "machine's measured pass costs, 0 = a target step; with --weights base, draft)")
    p.add_argument("--weights", choices=WEIGHT_SETS, default=WEIGHTS_NESTED, help="nested: both planes (every "
                   "policy); base: the base planes only, the refinement planes never read (the 4-bit model by itself, "
                   "--policy draft; for a model whose 8-bit planes do not fit)")
    p.add_argument("--gamma", type=gamma(), help=f"draft tokens per speculative round (default {GenerateConfig.gamma}); "
                   f"with auto, the most it may choose (1..{MAX_GAMMA}, default {MAX_GAMMA})")
    p.add_argument("--remeasure-costs", action="store_true", help="auto: time the passes again instead of reading "
                   "this machine's cached cost table")
    p.add_argument("--max-context", type=count(2), help="KV cache capacity in positions (default 2048, or with "
                                                   "--device the largest that fits)")
    p.add_argument("--device", help="plan memory for this device profile (scripts/max_context.py) and refuse "
                                    "requests over it")
    p.add_argument("--kv-window", type=count(0), help="elastic KV (docs/memory.md): each query reads KV8 for its "
                   "last N positions, KV4 before, so the context may pass what KV8 fits (default: only where "
                   "--max-context passes the --device plan's KV8 maximum, window 256; 0: never)")
    p.add_argument("--kv8-draft-below", type=count(0), default=2048, help="draft with KV8 below this context, else --long-draft-kv")
    p.add_argument("--long-draft-kv", choices=("kv4", "recent"), default="kv4")
    p.add_argument("--recent", type=count(), default=256, help="KV8 window of the recent draft KV view")
    add_draft_head_arguments(p)
    add_policy_arguments(p)
    add_meter_arguments(p)
    p.add_argument("--energy-log", help="append every power sample with its phase (prefill, draft, verify, idle) "
                                        "to this file as JSON lines")
    p.add_argument("--idle-seconds", type=at_least(), default=0.0, help="measure idle power this long before the first "
                   "answer (idle samples between answers count too)")


def llm_config(a, sampling: SamplingConfig = SamplingConfig(),
               max_new_tokens: int = GenerateConfig.max_new_tokens) -> GenerateConfig:
    """The options as typed settings; `--gamma` is the round length of the fixed policies and auto's ceiling."""
    policy = a.policy or default_policy(a.weights)
    auto = policy == "auto" and a.gamma is not None
    return GenerateConfig(policy=policy, gamma=GenerateConfig.gamma if a.gamma is None or auto else a.gamma,
                          max_new_tokens=max_new_tokens, sampling=sampling,
                          draft_kv=DraftKVPolicy(a.kv8_draft_below, a.long_draft_kv, a.recent),
                          gate=gate_config(a), adaptive=adaptive_config(a),
                          auto=AutoConfig(gamma_max=a.gamma) if auto else AutoConfig())


def make_llm(a, cfg: GenerateConfig, checkpoint: Optional[str] = None) -> LLM:
    """The LLM the options describe (`checkpoint` resolved by the caller); the meter starts once the model is loaded,
    and a refused cost table is one line on stderr."""
    return LLM(checkpoint or a.checkpoint, config=cfg, backend=a.backend, max_context=a.max_context, device=a.device,
               meter=lambda: make_meter_from(a), energy_log=a.energy_log, idle_seconds=a.idle_seconds,
               remeasure_costs=a.remeasure_costs, on_note=lambda note: print(f"auto: {note}", file=sys.stderr),
               kv_window=a.kv_window, weights=a.weights, **draft_head_options(a))
