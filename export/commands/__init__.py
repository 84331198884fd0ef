"""The `bitnest` command: every subcommand in one table, one module each in this folder (`export/commands/NAME.py`,
NAME the command with `_` for `-`: its options and `main(argv) -> int`, nothing else), imported only when it runs.
`scripts/NAME.py` run the same modules from a checkout; `python -m export.commands NAME` runs them as a child.

The commands live in export/, the top of the import order (export may import edge and plugins, edge never imports
export), because they wire host-side pieces into device-side work: the default model's export for every command that
reads a checkpoint (`bitnest chat` on a fresh machine exports SmolLM2 once, then chats: `default_checkpoint`), the
ONNX exporter for the self-check, the float reference for the evaluation. What a command does lives below it: the
runtime in edge/ (the front door edge.llm.LLM), the analysis in edge/analysis/, the research tools in export/tools/.
"""

import importlib
import sys
from pathlib import Path
from typing import Optional

COMMANDS = {     # name: what it does (its module: command_module(name))
    "chat": "chat with a nested checkpoint (one prompt, a prompts file, or interactive)",
    "serve": "an OpenAI-compatible HTTP server over a nested checkpoint (docs/serve.md)",
    "export": "export a nested W4/W8 checkpoint (and its ONNX graph / TensorRT engine)",
    "evaluate": "perplexity and draft/target agreement on held-out text",
    "bench": "decode speed of each policy against transformers, medians as JSON",
    "lossless": "speculative output against target output on real prompts",
    "max-context": "the largest context per configuration on a device profile",
    "weights-memory": "resident memory of --weights base against the 8-bit run, and the refinement planes it never "
                      "read",
    "joules": "decode-phase J/token of each policy from a power meter",
    "selfcheck": "every decode path this machine runs, against the reference",
    "calibrate": "calibrate the gate thresholds beside a checkpoint",
    "replay": "Precision on Demand replay: AUCs, budgets, cost model, figures",
    "compare": "live comparison of every policy, paired tests",
    "export-memory": "the streamed export's peak memory and time per block at a model's real shapes (synthetic "
                     "weights), against its plan",
    "quality-table": "export variants and tabulate their perplexity and agreement",
    "draft-layers": "what a draft that skips decoder layers would agree and save, and its projected speed-up",
    "verify-onnx": "the exported step graph through onnxruntime against torch",
    "compile-kernels": "compile every Triton kernel for sm_87 without a GPU",
    "bench-kernels": "GB/s of every Triton kernel on a CUDA GPU",
    "gemv-sweep": "the decode GEMV's access patterns and launch configurations on a CUDA GPU",
    "tables": "rewrite the docs' result tables from scripts/results/*.json (--check)",
    "device-check": "every GPU check in one run (scripts/device_check.sh): JSON and its docs table",
    "replay-tegrastats": "print recorded tegrastats lines at an interval",
    "fuzz-inputs": "mutated inputs at every reader, killed and disk-full exports",
}


def command_module(name: str) -> str:
    """The module of command `name`: export.commands.NAME (`_` for `-`)."""
    return f"export.commands.{name.replace('-', '_')}"


def default_checkpoint(model: Optional[str] = None) -> Path:
    """The export of `model` (None: the default model) with every default option, made first where it is absent
    (export.pipeline, imported only when a command is given no --checkpoint)."""
    from export.pipeline import ensure_default_checkpoint
    return ensure_default_checkpoint(model or "default")


def run_command(name: str, argv=None) -> int:
    """Run subcommand `name` with `argv` (default: the process's own arguments)."""
    module = importlib.import_module(command_module(name))
    return module.main(sys.argv[1:] if argv is None else argv)


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {n:<{width}}  {summary}" for n, summary in COMMANDS.items())
    return f"usage: bitnest COMMAND [options]   (bitnest COMMAND --help for its options)\n\ncommands:\n{rows}"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"bitnest: error: unknown command {argv[0]!r}: use one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    return run_command(argv[0], argv[1:])

