"""Command-line pieces shared by the commands: the gate and adaptive-speculation options (chat, bench,
compare_policies) and their typed configs, the power-meter options (chat, joules_per_token), and the
checkpoint/backend/--json options that calibrate_gates, replay and compare_policies share."""

import argparse
import shlex

from edge.argtypes import Parser, at_least, count, gamma, seed, unit
from edge.backends import BACKENDS
from edge.decode.adaptive import AdaptiveConfig
from edge.decode.config import PHASE_ORDERS, GateConfig
from edge.decode.signals import SIGNALS
from edge.model.draft_head import DRAFT_HEADS, SHORTLIST_K
from edge.model.packaged import PACKAGED_MODELS
from edge.errors import BitNestError


def tool_parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = Parser(prog=prog, description=description)
    p.add_argument("--checkpoint", help="nested checkpoint folder (default: the embedded SmolLM2 export)")
    add_model_argument(p)
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="auto: native where it builds, else cpu "
                   "(the chat's default: thresholds are calibrated per backend)")
    add_draft_head_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    return p


def add_draft_head_arguments(p: argparse.ArgumentParser, vocab: bool = True) -> None:
    """--draft-head / --shortlist-k / --draft-vocab (where `vocab`): what the draft reads of a nested LM head
    (edge.model.draft_head), overriding the checkpoint's setting; a float16 head refuses them in one line."""
    g = p.add_argument_group("draft head (checkpoints with a nested LM head)")
    g.add_argument("--draft-head", choices=DRAFT_HEADS, help="8bit: the draft reads the head at the target's 8-bit "
                   "view; 4bit: its base plane; shortlist: the base plane's top K rows re-scored at 8 bits "
                   "(default: the checkpoint's setting)")
    g.add_argument("--shortlist-k", type=count(), help=f"rows the shortlist re-scores (default: the checkpoint's, "
                   f"{SHORTLIST_K} unless it records another)")
    if vocab:
        g.add_argument("--draft-vocab", type=count(), help="the draft scores token ids below this only, so it reads "
                       "that many rows of the head (default: the checkpoint's; the whole vocabulary unless it records "
                       "less)")


def draft_head_options(a) -> dict:
    """The LLM keyword arguments of the draft-head options."""
    return {"draft_head": a.draft_head, "shortlist_k": a.shortlist_k, "draft_vocab": a.draft_vocab}


def add_model_argument(p: argparse.ArgumentParser) -> None:
    """--model: a model preset whose default export the command reads (made first if absent), instead of
    --checkpoint."""
    p.add_argument("--model", choices=("default", *PACKAGED_MODELS), help="read this model's export with every "
                   "default option (exported first, once, if absent; edge.model.packaged) instead of --checkpoint")


def checkpoint_arg(a, default_checkpoint) -> str:
    """--checkpoint, or the export of --model (default: the embedded default model; `default_checkpoint(model)` may
    export it first)."""
    model = getattr(a, "model", None)
    if a.checkpoint:
        if model:
            raise BitNestError("pass --checkpoint DIR or --model NAME, not both")
        return a.checkpoint
    if default_checkpoint is None:
        raise BitNestError("pass --checkpoint DIR")
    return str(default_checkpoint(model) if model else default_checkpoint())


def add_policy_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("gates (gate-entropy, gate-margin, gate-lagged, gate-phase, gate-random)")
    g.add_argument("--gate-threshold", type=at_least(), help="entropy (nats, escalate above) or margin (logits, escalate "
                   "below); default: the threshold calibrated for --gate-rate")
    g.add_argument("--gate-rate", type=unit(), default=0.15, help="target escalation rate (0.03, 0.07, 0.15 or 0.3 "
                   "calibrated); for gate-random, the share of decode steps it escalates (any value in [0, 1])")
    g.add_argument("--gate-signal", choices=SIGNALS, default="entropy", help="the signal of gate-lagged and gate-repair")
    g.add_argument("--gate-seed", type=seed(), default=0, help="gate-random's seed")
    g.add_argument("--phase-tag", default="</think>", help="gate-phase: the closing tag between the phases")
    g.add_argument("--phase-order", choices=PHASE_ORDERS, default="low-high",
                   help="gate-phase: low view until the tag and high after, or the reverse")
    a = p.add_argument_group("adaptive speculation")
    a.add_argument("--adaptive-signal", choices=SIGNALS, default="margin")
    a.add_argument("--adaptive-stop", type=at_least(), default=AdaptiveConfig.stop,
                   help="end the round after a proposal whose draft margin is below (entropy above) this")
    a.add_argument("--adaptive-extend", type=at_least(none="never extend"), default=AdaptiveConfig.extend,
                   help="draft past --gamma while the margin is at least (entropy at most) this; none: never")
    a.add_argument("--gamma-max", type=gamma(), default=AdaptiveConfig.gamma_max, help="most proposals per adaptive round")


def gate_config(a) -> GateConfig:
    return GateConfig(a.gate_threshold, a.gate_rate, a.gate_signal, a.gate_seed, a.phase_tag, a.phase_order)


def adaptive_config(a) -> AdaptiveConfig:
    return AdaptiveConfig(a.adaptive_signal, a.adaptive_stop, a.adaptive_extend, a.gamma_max)


def add_meter_arguments(p: argparse.ArgumentParser, default: str = "auto") -> None:
    from edge.energy import METERS
    g = p.add_argument_group("energy")
    g.add_argument("--meter", default=default, choices=METERS, help="power meter (auto: the first of tegrastats, "
                   "jtop, nvml that gives a reading here)")
    g.add_argument("--interval-ms", type=count(), default=100, help="tegrastats / jtop sampling interval")
    g.add_argument("--meter-command", help="command whose stdout is tegrastats lines (default: tegrastats)")
    g.add_argument("--rail", help="tegrastats rail to integrate (default VDD_IN, else the sum of all rails)")


def make_meter_from(a):
    """The started meter the meter options name (one-line BitNestError where a named meter is unavailable)."""
    from edge.energy import make_meter
    if a.interval_ms < 1:
        raise BitNestError("--interval-ms must be at least 1")
    return make_meter(a.meter, a.interval_ms, shlex.split(a.meter_command) if a.meter_command else None, a.rail)
