"""The `bitnest` command: every subcommand in one table, each module imported only when it runs.

It lives in export/, the top of the import order (export may import edge and plugins, edge never imports export),
because it wires host-side pieces into device-side commands: the default model's export for every command that
reads a checkpoint (`bitnest chat` on a fresh machine exports SmolLM2 once, then chats) and the ONNX exporter for
the self-check. `scripts/NAME.py` are thin wrappers over the same table.
"""

import importlib
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    module: str                       # its `main(argv, ...)` does the work
    summary: str
    default_checkpoint: bool = True   # hand it the default-model export for a missing --checkpoint


COMMANDS = {
    "chat": Command("edge.cli.chat", "chat with a nested checkpoint (one prompt, a prompts file, or interactive)"),
    "serve": Command("edge.cli.serve", "an OpenAI-compatible HTTP server over a nested checkpoint (docs/serve.md)"),
    "export": Command("export.cli", "export a nested W4/W8 checkpoint (and its ONNX graph / TensorRT engine)", False),
    "evaluate": Command("edge.analysis.evaluate", "perplexity and draft/target agreement on held-out text", False),
    "bench": Command("edge.analysis.bench.run", "decode speed of each policy against transformers, medians as JSON"),
    "lossless": Command("edge.analysis.lossless", "speculative output against target output on real prompts"),
    "max-context": Command("edge.cli.max_context", "the largest context per configuration on a device profile"),
    "weights-memory": Command("edge.analysis.weights_memory", "resident memory of --weights base against the 8-bit "
                              "run, and the refinement planes it never read"),
    "joules": Command("edge.cli.joules", "decode-phase J/token of each policy from a power meter"),
    "selfcheck": Command("edge.cli.selfcheck", "every decode path this machine runs, against the reference"),
    "calibrate": Command("edge.analysis.calibrate", "calibrate the gate thresholds beside a checkpoint"),
    "replay": Command("edge.analysis.replay.analyse", "Precision on Demand replay: AUCs, budgets, cost model, figures"),
    "compare": Command("edge.analysis.compare", "live comparison of every policy, paired tests"),
    "export-memory": Command("export.export_memory", "the streamed export's peak memory and time per block at a model's "
                             "real shapes (synthetic weights), against its plan", False),
    "quality-table": Command("export.quality", "export variants and tabulate their perplexity and agreement", False),
    "verify-onnx": Command("edge.cli.verify_onnx", "the exported step graph through onnxruntime against torch", False),
    "compile-kernels": Command("edge.cli.compile_kernels", "compile every Triton kernel for sm_87 without a GPU", False),
    "bench-kernels": Command("edge.cli.bench_kernels", "GB/s of every Triton kernel on a CUDA GPU", False),
    "tables": Command("edge.analysis.report.tables", "rewrite the docs' result tables from scripts/results/*.json (--check)",
                      False),
    "device-check": Command("edge.cli.device_check", "every GPU check in one run (scripts/device_check.sh): JSON "
                            "and its docs table", False),
    "replay-tegrastats": Command("edge.energy.tegrastats_replay", "print recorded tegrastats lines at an interval",
                                 False),
    "fuzz-inputs": Command("export.fuzz_inputs", "mutated inputs at every reader, killed and disk-full exports"),
}


def _onnx_exporter(checkpoint, path) -> str:
    from export.onnx_export import export_onnx
    return export_onnx(checkpoint, path)["onnx"]


def _float_reference(spec):
    from export.sources import float_reference
    return float_reference(spec)


def run_command(name: str, argv=None) -> int:
    """Run subcommand `name` with `argv` (default: the process's own arguments)."""
    cmd = COMMANDS[name]
    kwargs = {}
    if cmd.default_checkpoint:
        from export.pipeline import ensure_default_checkpoint
        kwargs["default_checkpoint"] = ensure_default_checkpoint
    if name == "selfcheck":
        kwargs["onnx_exporter"] = _onnx_exporter
    if name == "evaluate":
        kwargs["reference_loader"] = _float_reference
    return importlib.import_module(cmd.module).main(sys.argv[1:] if argv is None else argv, **kwargs)


def usage() -> str:
    width = max(map(len, COMMANDS))
    rows = "\n".join(f"  {n:<{width}}  {c.summary}" for n, c in COMMANDS.items())
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


if __name__ == "__main__":
    sys.exit(main())
