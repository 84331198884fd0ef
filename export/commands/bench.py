"""`bitnest bench` (scripts/bench.py): decode speed of each policy and its peers, each runner in its own process under
a memory plan (edge.analysis.bench), medians as JSON."""

import argparse
import sys

from edge.analysis.bench.common import cache_folder, default_threads
from edge.analysis.bench.run import DEFAULT_POLICIES, PEERS, SHAPES, __doc__ as _TOOL_DOC, bench
from edge.argtypes import Parser, count, gamma
from edge.backends import BACKENDS
from edge.options.run import run_cli
from edge.options.groups import (add_draft_head_arguments, add_model_argument, add_policy_arguments, checkpoint_arg,
                                 draft_head_options)
from edge.decode.registry import POLICIES
from edge.errors import BitNestError
from edge.memory.model_shapes import MODEL_PRESETS
from edge.memory.synthetic import R4_LAYOUTS
from export.commands import default_checkpoint


def parser() -> argparse.ArgumentParser:
    """The command's options (main parses them)."""
    p = Parser(prog="bench.py", description=_TOOL_DOC,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", help="nested checkpoint folder (default: the embedded SmolLM2 export)")
    add_model_argument(p)
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="backend that runs the nested views")
    p.add_argument("--prompts", type=count(), default=8, help="held-out ShareGPT requests (acceptance, and so every "
                   "speculative figure, rests on them: 8 at least)")
    p.add_argument("--max-new-tokens", type=count(2), default=64)
    p.add_argument("--stop-at-eos", action="store_true", help="this runtime's policies stop at the model's end of "
                   "text (default: every generation runs --max-new-tokens tokens, EOS ignored, as the peers do)")
    p.add_argument("--gamma", type=gamma(), default=4)
    p.add_argument("--repeats", type=count(), default=3)
    p.add_argument("--threads", type=count(), help="threads of every runner (default: torch's count here)")
    p.add_argument("--pass-repeats", type=count(), default=15, help="timed passes per view and width (median)")
    p.add_argument("--memory-mib", type=count(), help="memory the runners may hold together (default: 90%% of this "
                   "host's MemAvailable): runners that do not fit together run in groups one after another, one that "
                   "does not fit alone is skipped (edge.analysis.bench.memory)")
    p.add_argument("--policy", action="append", choices=POLICIES,
                   help=f"policy to time (repeatable; default: {', '.join(DEFAULT_POLICIES)})")
    p.add_argument("--peer", action="append", choices=PEERS, help="peer to time beside them (repeatable; default: "
                   "llamacpp and hf, with --shape llamacpp; none: no peer)")
    p.add_argument("--shape", help=f"time a synthetic checkpoint of a real model's shapes ({', '.join(SHAPES)}): "
                   "target and draft AR, speculation replayed from the default model's rounds and projected, "
                   "llama.cpp Q8_0 on a GGUF of the same shapes")
    p.add_argument("--acceptance-from", help="with --shape: a bench JSON whose runs.speculative holds the recorded "
                   "rounds (or at least the acceptance) to follow, instead of recording them in this run")
    p.add_argument("--passes-only", action="store_true", help="with --shape: only the pass times per view and width "
                   "(no prompts, peers or acceptance), for each --r4 layout, each in its own process")
    p.add_argument("--r4", action="append", choices=R4_LAYOUTS, help="with --passes-only: the R4 layout of the "
                   "synthetic checkpoint (repeatable; default online): the online rule's factors, the legacy rule's "
                   "(checkpoints exported before issue 34), or none")
    p.add_argument("--prefill", type=count(0), default=512, help="with --passes-only: tokens of the timed prefill "
                   "(0: none)")
    p.add_argument("--rounds", type=count(), default=1, help="with --passes-only: times each layout is loaded and "
                   "timed, in turn")
    add_draft_head_arguments(p)
    p.add_argument("--json", action="store_true")
    add_policy_arguments(p)
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)            # the option types refuse counts out of range
    command = "python scripts/bench.py " + " ".join(sys.argv[1:] if argv is None else argv)

    def body():
        if a.shape is None:
            if a.acceptance_from:
                raise BitNestError("--acceptance-from goes with --shape")
            if a.passes_only or a.r4:
                raise BitNestError("--passes-only and --r4 go with --shape")
            return bench(a, checkpoint_arg(a, default_checkpoint), command.strip())
        if a.shape not in SHAPES:
            raise BitNestError(f"unknown shape {a.shape!r}: use one of {', '.join(SHAPES)}")
        if a.passes_only:
            from edge.analysis.bench.passes import bench_passes
            peers = set(a.peer or ()) - {"none"}
            if peers - {"llamacpp-native"}:
                raise BitNestError("--passes-only takes --peer llamacpp-native (llama-bench built for this CPU) or none")
            return bench_passes(MODEL_PRESETS[a.shape], a.shape, a.r4 or ["online"], a.rounds, a.pass_repeats,
                                a.threads or default_threads(), a.backend, a.gamma, command.strip(), a.prefill,
                                "llamacpp-native" in peers, cache_folder(), draft_head_options(a))
        if a.r4:
            raise BitNestError("--r4 goes with --passes-only")
        from edge.analysis.bench.shape import bench_shape
        return bench_shape(a, MODEL_PRESETS[a.shape], a.shape, checkpoint_arg(a, default_checkpoint), command.strip())
    return run_cli(body, a.json, "bench.py")
