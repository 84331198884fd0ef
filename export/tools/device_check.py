"""The checks of one CUDA machine in one run (scripts/device_check.sh, <= 300 s by default, no network): the
checkpoint cannot travel, so random-plane checkpoints of the default model's shapes (and Llama-2-7B's, opt-in with
--with-7b) are built on the GPU (edge.memory.synthetic), with a default export's online rotations (R1, R4:
PASS_CHECKPOINT); the export's GPTQ on CUDA is opt-in too (--with-gptq). It writes one JSON object, from which
`--table` prints the docs table.

    python -m export.tools.device_check --out FILE.json [--dry] [--repeats N] [--with-7b] [--with-gptq] [--sections a,b]
                                    [--limits kernels=120,...] [--hang SECTION (dry only)] [--checkpoint DIR]
                                    [--onnx FILE]
    python -m export.tools.device_check --table FILE.json

Sections: every kernel against the oracle on the GPU, and the kernels' unit tests compiled for it; kernel GB/s against
the same run's copy bandwidth; the `triton` backend lossless (speculative = target) on the 135M shape; draft-, target-
and verification-pass times of the eager launchers, the static passes and their CUDA-graph replays; the speculative
speed-up those times project at the acceptance measured on the real model (tokens per round x target pass / (γ draft
passes + 1 verification)); where each pass's device time goes (`profile`: the profiler's kernel records by family,
edge.analysis.pass_profile); the TensorRT plugins' own code on the device through the stand-in of TensorRT 10.3's API
(export.tools.device_plugins: the conformance and KV-binding suites, CUDA-graph replay of the plugin enqueues);
TensorRT, where importable: the SmolLM2 engine (a --checkpoint export, or an RTN export of the default model made on the
spot) built with the ping-pong KV binding and run against the independent step reference (export.trt.check, in a process
of its own: greedy tokens equal, prefill logits within the self-check's bound; the binding, the plane copies its engine
inspector lists and the runtime plugins' kv_window recorded), skipped with the reason where TensorRT is absent; with
--with-gptq, the default model exported with GPTQ on CUDA and evaluated as the committed CPU figures were
(export.tools.device_gptq: draft/target agreement within 0.5 points of them on every corpus; in a dry run the same path
on the CPU at a tiny calibration, plumbing only). In the dry run with --checkpoint the same section runs with the graph
on the CPU (onnxruntime) standing in for the engine. `--dry` runs the same code in the Triton interpreter on the CPU at
tiny shapes (a test runs it, so a typo costs no device time); its figures mean nothing.

Evidence survives a timeout: the JSON is written (atomically) before and after every section (`running` names the
one under way, `complete` is false until the end); a section past its limit (LIMITS, SIGALRM) is recorded as timed
out and the next runs, the bandwidth and pass_times sections keeping the rows they finished (`NAME_stopped` names
the stop); the tensorrt and plugins sections' children are stopped TRT_STOP_MARGIN / PLUGINS_STOP_MARGIN seconds
before, naming the phase (edge.phase_clock) or the test they were in; the script's own `timeout` bounds the whole run
for a section stuck in native code. The Llama-2-7B shape, where asked, is skipped by itself on a device with under
SEVEN_B_MIN_GIB of memory (an 8 GB Orin), and the JSON says why.
"""

import json
import os
import platform
import signal
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from edge.atomic import write_atomic
from export.tools.device_gptq import PLUMBING, gptq_section
from export.tools.device_plugins import plugins_section
from edge.errors import BitNestError
from edge.phase_clock import hang as _hang
from edge.analysis.report.device import GAMMA, SECTIONS
from edge.phase_clock import read_phases

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "scripts" / "results" / "sweep-bitnest.json"    # the real model's speculation sweep (README)
# the kernels' unit tests, on the GPU in a real run (test_kernels.py took 16 s on an H200)
KERNEL_TESTS = ("tests/test_kernels.py", "tests/test_tiled_gemv.py", "tests/test_swiglu_kernel.py")
KERNEL_TESTS_DRY = ("tests/test_kernels.py::test_dual_plane_linear_rejects_bad_shapes",)
OPT_IN = {"gptq": "--with-gptq"}   # sections that run only when asked, past the default run's 300 s
# Seconds per section: the first seven's sum (295) stays under scripts/device_check.sh's timeout of the whole run
# (300); where TensorRT is importable the script adds the tensorrt section's (an engine build takes minutes), with
# --with-gptq the gptq section's: 300 s, estimated (no GPU run yet) from the 2-core CPU's ~6 min export and 168 s
# evaluation: on CUDA ~1-2 s a block, the evaluation on 16 cores ~40-60 s, room for a cold machine and the estimate.
# Measured on an H200 (triton 3.6, all compiled cold): kernels 28 s (unit tests 16), bandwidth 9-11, lossless 3-5, pass
# times 10-12 (7B included), plugins 12-15. Estimated since (no GPU run yet): bandwidth beyond L2, tiled and canonical
# (~18 cold compiles) 70; pass times at three shapes, five forms on sm_90 (~25 kernels compiled cold without PDL, ~8
# GEMVs without the prefetch) 80; profile 25; prefill (~9 cold compiles) 40; lossless 20 (15 s in a busy dry run).
LIMITS = {"kernels": 40, "bandwidth": 70, "prefill": 40, "lossless": 20, "pass_times": 80, "profile": 25,
          "plugins": 20, "tensorrt": 300, "gptq": 300}
# A dry run's default limits are these times DRY_LIMIT_SCALE (the interpreter on a CPU: lossless 15-20 s on a busy
# 2-core CPU against 3-5 s on the H200). Limits given with --limits are taken as given (the timeout tests rely on them).
DRY_LIMIT_SCALE = 4
# The sections whose result passes or fails the run, where they ran (the others measure): a section that raised or
# timed out holds only {"error"} and fails its verdict; a skipped one (its reason recorded) fails nothing.
VERDICTS = {"kernels": lambda r: bool(r.get("passed")), "lossless": lambda r: bool(r.get("identical")),
            "prefill": lambda r: bool(r.get("identical")) and bool(r.get("attention_close")),
            "plugins": lambda r: r.get("status") == "skipped" or bool(r.get("passed")),
            "tensorrt": lambda r: "error" not in r and r.get("status") != "failed",
            "gptq": lambda r: r.get("status") in ("passed", PLUMBING)}
TRT_STOP_MARGIN = 2.0     # seconds before the tensorrt section's limit at which its child is stopped
TRT_HANG_PHASE = "load"   # where `--hang tensorrt` makes the child hang (its first phase with a checkpoint given)
SEVEN_B_MIN_GIB = 12      # the 7B shape's synthetic checkpoint (~7 GB of planes) plus KV, workspace and the context


@dataclass(frozen=True)
class DeviceCheckOptions:
    dry: bool = False                 # the interpreter on the CPU, tiny shapes
    repeats: int = 3
    new_tokens: int = 32              # the lossless check's tokens
    skip_7b: bool = True              # the Llama-2-7B shape is opt-in (--with-7b): minutes of planes on the GPU
    sections: tuple = SECTIONS        # which sections run, in SECTIONS order
    limits: tuple = ()                # ((section, seconds), ...) over LIMITS
    hang: str | None = None           # dry runs only: this section hangs (pass_times: after its first form)
    checkpoint: str | None = None     # the tensorrt section's checkpoint (default: export the default model)
    onnx: str | None = None           # the tensorrt section's step graph (default: exported from the checkpoint)
    with_gptq: bool = False           # the gptq section is opt-in (--with-gptq): minutes of export and evaluation

    def __post_init__(self):
        if self.repeats < 1 or self.new_tokens < 2:
            raise ValueError("--repeats must be >= 1 and --new-tokens >= 2")
        bad = [s for s in (*self.sections, *(k for k, _ in self.limits), self.hang or SECTIONS[0]) if s not in SECTIONS]
        if bad:
            raise ValueError(f"unknown section {bad[0]!r}: use {', '.join(SECTIONS)}")
        if any(v <= 0 for _, v in self.limits):
            raise ValueError("a section's time limit must be > 0 seconds")
        if self.hang and not self.dry:
            raise ValueError("--hang simulates a timeout in a dry run only (--dry)")

    def limit(self, section: str) -> float:
        """The section's time limit in seconds: --limits where given, else LIMITS (x DRY_LIMIT_SCALE in a dry run)."""
        return dict(self.limits).get(section, LIMITS[section] * (DRY_LIMIT_SCALE if self.dry else 1))

    @property
    def chosen(self) -> tuple:
        """The sections that run: --sections, in SECTIONS order, the opt-in ones only where asked."""
        asked = {"gptq": self.with_gptq}
        return tuple(s for s in SECTIONS if s in self.sections and asked.get(s, True))


def seven_b_skip_reason(total_bytes: int) -> str | None:
    """Why the 7B shape cannot run on a device with `total_bytes` of memory, or None where it fits."""
    gib = total_bytes / 2 ** 30
    return f"skipped: the device has {gib:.1f} GiB, the 7B shape needs about {SEVEN_B_MIN_GIB} GiB" \
        if gib < SEVEN_B_MIN_GIB else None


class SectionTimeout(BaseException):
    """A section ran past its limit (BaseException: a section's own `except Exception` does not swallow it)."""


def _within(seconds: float, fn):
    """fn() with SIGALRM after `seconds` raising SectionTimeout (Python code only: native code finishes first)."""
    def expire(signum, frame):
        raise SectionTimeout(f"timed out after {seconds:g} s (its limit)")
    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        return fn()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _models(opts: DeviceCheckOptions) -> dict:
    """{name: (ModelConfig, KV capacity, prompt tokens)} at the run's shapes."""
    from edge.memory.model_shapes import MODEL_PRESETS, _llama
    if opts.dry:      # two layers, head dim 32, GQA 2:1: the Triton interpreter runs a pass of it in ~0.3 s
        return {"tiny": (_llama("LlamaForCausalLM", 64, 128, 2, 2, 1, 256, 512, 1e4), 48, 8)}
    out = {"smollm2-135m": (MODEL_PRESETS["smollm2-135m"], 512, 64),
           "qwen2.5-1.5b": (MODEL_PRESETS["qwen2.5-1.5b"], 512, 64)}         # the device's model size (~2 GB)
    if not opts.skip_7b:
        out["llama-2-7b"] = (MODEL_PRESETS["llama-2-7b-32k"], 512, 64)
    return out


def environment() -> dict:
    import torch
    from plugins.trt.plugins import tensorrt_unavailable
    out = {"python": platform.python_version(), "machine": platform.machine(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
           "interpreter": os.environ.get("TRITON_INTERPRET") == "1",
           "ptxas": os.environ.get("TRITON_PTXAS_PATH")}
    try:
        import triton
        out["triton"] = triton.__version__
    except ImportError as e:
        out["triton"] = f"missing ({e})"
    out["tensorrt"] = tensorrt_unavailable() or "present"
    return out


def kernels(opts: DeviceCheckOptions) -> dict:
    """Every kernel against the pure-torch oracle (random RTN-nested planes; tiny ones in the dry run), then the
    kernels' unit tests compiled for this GPU (`unit_tests`: every shape, group size and GQA layout they cover; the
    dry run runs one of them, plumbing only: the suite runs them all here in the interpreter)."""
    from plugins.kernels.selfcheck import random_linears, run_checks
    t0 = time.time()
    if opts.dry:
        from plugins.nesting import nest_rtn
        from plugins.packing import pack_nibbles
        import torch
        c = nest_rtn(torch.randn(32, 128, generator=torch.Generator().manual_seed(0)) * 0.05, 64)
        out = run_checks([("random[32x128]", pack_nibbles(c.q4), pack_nibbles(c.qr), c.scale, c.offset)], (4, 2, 32))
    else:
        out = run_checks(random_linears())
    left = opts.limit("kernels") - (time.time() - t0)
    out["unit_tests"] = plugins_section(left, KERNEL_TESTS_DRY if opts.dry else KERNEL_TESTS, dry=opts.dry,
                                        workers=0 if opts.dry else min(8, os.cpu_count() or 1))
    out["passed"] = bool(out["passed"]) and bool(out["unit_tests"].get("passed"))
    return out


def bandwidth(opts: DeviceCheckOptions, done: dict | None = None) -> dict:
    """Kernel GB/s as a share of the copy bandwidth measured in the same run: the decode GEMV (INT8 activations,
    M = 1, 5, 8) at the shapes beyond L2 (first) and the real shapes of Qwen2.5-1.5B and Llama-3-8B, each launch on
    its own copy of the planes (edge.analysis.kernel_bench.ring), and attention at 4K and 16K positions. Rows land in
    `done` as each is measured (a section stopped at its limit keeps them)."""
    from edge.analysis import kernel_bench as b
    if opts.dry:
        dev, timer, shapes, contexts, layouts, nbytes = "cpu", b.time_host, [(128, 64)], [256], [("tiny", 4, 2, 32)], 1 << 20
    else:
        dev, timer, shapes, contexts, layouts, nbytes = "cuda", b.time_graph, b.DEVICE_CHECK_SHAPES, [4096, 16384], \
            b.ATTENTION_LAYOUTS, 512 << 20
    copy = b.copy_bandwidth(opts.repeats, nbytes, dev, timer)
    out = {} if done is None else done
    out |= {"copy_GBps": copy / 1e9, "l2_bytes": b.l2_bytes(dev), "gemv": [], "attention": []}
    b.gemv_rows(opts.repeats, copy, shapes, dev, timer, acts=("int8",), rows=out["gemv"])
    b.attention_rows(opts.repeats, copy, contexts, layouts, dev, timer, rows=out["attention"])
    return out


def prefill(opts: DeviceCheckOptions) -> dict:
    """A prefill chunk of 256 tokens (12 at a tiny shape in the dry run) through the tiled planes on the tensor
    cores against the decode kernel in passes of 8, at Llama-2-7B's and Qwen2.5-1.5B's shapes: times, speed-up,
    and `identical`, both paths' rows equal bit for bit on this GPU (the verdict)."""
    from edge.analysis import kernel_bench as b
    if opts.dry:
        rows = b.prefill_rows(opts.repeats, [(128, 64)], "cpu", b.time_host, 12)
        attn = b.prefill_attention_rows(opts.repeats, [("tiny gqa 4/2", 4, 2, 32, 200, 40)], "cpu", b.time_host)
    else:
        rows = b.prefill_rows(opts.repeats, device="cuda", timer=b.time_graph)
        attn = b.prefill_attention_rows(opts.repeats, device="cuda", timer=b.time_graph)
    return {"rows": rows, "identical": all(r["identical"] for r in rows), "attention": attn,
            "attention_close": all(r["close"] for r in attn)}


def _pass_bytes(cfg) -> dict:
    """Weight bytes each pass reads (edge.engine.stats.weight_bytes_per_pass, on a shapes-only checkpoint of cfg)."""
    from edge.engine.stats import weight_bytes_per_pass
    from edge.memory.synthetic import synthetic_checkpoint
    ckpt = synthetic_checkpoint(cfg, device="meta")
    return {"draft": weight_bytes_per_pass(ckpt, "draft"), "target": weight_bytes_per_pass(ckpt, "target"),
            "verify": weight_bytes_per_pass(ckpt, "target", GAMMA + 1)}


def step_bandwidth(result: dict, opts: DeviceCheckOptions) -> dict:
    """Each model's weight bytes a pass reads over its measured pass time, as a share of the bandwidth section's copy
    bandwidth: {model: {"bytes": {draft, target, verify}, form: {draft, target, verify}}}."""
    copy = result.get("bandwidth", {}).get("copy_GBps")
    if not copy:
        return {}
    models, out = _models(opts), {}
    for model, forms in result["pass_times"].items():
        need = _pass_bytes(models[model][0])
        out[model] = {"bytes": need} | {form: {k: round(need[k] / (t[f"{k}_ms"] / 1e3) / (copy * 1e9), 3)
                                               for k in need} for form, t in forms.items()}
    return out


def gemv_in_pass(result: dict, opts: DeviceCheckOptions) -> dict:
    """The GEMV kernels inside each profiled pass: the pass's weight bytes over the GEMV family's kernel time, as a
    share of the copy bandwidth (what the GEMV streams at inside the step, beside its isolated rows in the bandwidth
    section): {model: {draft, target, verify}}; {} without a copy bandwidth or a GEMV record."""
    copy = result.get("bandwidth", {}).get("copy_GBps")
    models, out = _models(opts), {}
    for model, passes in result["profile"].items():
        need = _pass_bytes(models[model][0])
        ms = {k: passes[k]["families"].get("gemv", {}).get("ms") for k in need}
        if copy and all(ms.values()):
            out[model] = {k: round(need[k] / (ms[k] / 1e3) / (copy * 1e9), 3) for k in need}
    return out


PASS_CHECKPOINT = ("random planes at the model's shapes, with the online rotations a default export records (R1 [H, H] "
                   "at the embedding and before the head, R4 of the online rule's factors before down_proj); "
                   "step_bandwidth counts the planes' bytes, not R1's 2*H*H*4 a pass")


def _checkpoint(cfg, dev: str):
    """PASS_CHECKPOINT of `cfg` on `dev`: a pass costs what a default export's does."""
    from edge.memory.synthetic import synthetic_checkpoint, with_online_rotations
    return with_online_rotations(synthetic_checkpoint(cfg, device=dev, seed=1))


def lossless(opts: DeviceCheckOptions, dev: str) -> dict:
    """Greedy speculative (γ = 4) against greedy target-only decoding through the `triton` engine (graphs on a GPU)."""
    import torch

    from edge.backends import make_engine
    from edge.decode.config import GenerateConfig
    from edge.decode.generate import generate
    name, (cfg, capacity, prompt_len) = next(iter(_models(opts).items()))
    eng = make_engine("triton", _checkpoint(cfg, dev), capacity, scratch=GAMMA + 4, prefill_chunk=64)
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(2)).tolist()
    new = opts.new_tokens if not opts.dry else 4
    runs = {}
    for policy in ("target", "speculative"):
        runs[policy], stats = generate(eng, prompt, GenerateConfig(policy=policy, gamma=GAMMA, max_new_tokens=new), set())
    s = stats.summary()
    return {"model": name, "tokens": len(runs["target"]), "identical": runs["speculative"] == runs["target"],
            "acceptance": s["acceptance"], "tokens_per_round": s["tokens_per_round"],
            "graphs_captured": getattr(eng, "graph_count", 0)}


def _at_shapes(opts: DeviceCheckOptions, dev: str):
    """(model, KV capacity, prompt, checkpoint, triton backend) at each of the run's shapes (`_models`), one at a
    time: the last one's planes are released (and the device's cache emptied) before the next is made."""
    import torch

    from edge.backends import make_backend
    for name, (cfg, capacity, prompt_len) in _models(opts).items():
        ckpt = _checkpoint(cfg, dev)
        prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(3)).tolist()
        yield name, capacity, prompt, ckpt, make_backend("triton", ckpt)
        del ckpt
        if dev == "cuda":
            torch.cuda.empty_cache()


def _passes(eng) -> dict:
    """The three passes a speculative round runs, on a prefilled engine, as a greedy round runs them (logits left on
    the device, their argmaxes to the host): {"draft", "target", "verify"} -> a call."""
    from edge.engine.kv_cache import KV8
    return {"draft": lambda: eng.forward([7], "draft", KV8, draft_slot=0, on_device=True).argmax(-1).tolist(),
            "target": lambda: eng.forward([7], "target", KV8, on_device=True).argmax(-1).tolist(),
            "verify": lambda: eng.forward([7] * (GAMMA + 1), "target", KV8, on_device=True).argmax(-1).tolist()}


def pass_times(opts: DeviceCheckOptions, dev: str, done: dict | None = None) -> dict:
    """Median wall time (ms, host included: what a greedy decode step waits for, its argmaxes on the host) of a draft
    pass (1 token into a draft slot), a target pass (1 token) and a verification pass (γ+1 tokens) for each engine
    form; on a GPU with programmatic dependent launch (sm_90 on: plugins.kernels.common.pdl) the graphs also
    without it (`graphs_no_pdl`), what it gains, and with it but without the GEMV's weight prefetch before its wait
    (`graphs_no_prefetch`), what that adds. Each form's row lands in `done` as it finishes (a section stopped at its
    limit keeps them: the run's caller records them; a dry run's `--hang pass_times` hangs after the first)."""
    from edge.analysis.pass_profile import median_ms
    from edge.backends.triton_graphs import GraphedEngine
    from edge.engine.interface import PassEngine
    from plugins.kernels.common import PDL_ENV, PREFETCH_ENV, env_off, pdl
    out = {} if done is None else done
    for name, capacity, prompt, ckpt, backend in _at_shapes(opts, dev):
        forms = {"eager": (PassEngine, {}), "static": (GraphedEngine, {"graphs": False})}
        if dev == "cuda":
            forms["graphs"] = (GraphedEngine, {"graphs": True})
            if pdl("cuda"):
                forms["graphs_no_pdl"] = (GraphedEngine, {"graphs": True})
                forms["graphs_no_prefetch"] = (GraphedEngine, {"graphs": True})
        rows = {}
        for form, (engine, kw) in forms.items():
            # the graphs of the last two forms captured and replayed without PDL, or without the prefetch
            with env_off(PDL_ENV, form == "graphs_no_pdl"), env_off(PREFETCH_ENV, form == "graphs_no_prefetch"):
                eng = engine(ckpt, backend, capacity, scratch=GAMMA + 4, **kw)
                eng.prefill(prompt)
                rows[form] = {f"{k}_ms": median_ms(fn, opts.repeats, dev == "cuda", warm=not opts.dry)  # nothing
                              for k, fn in _passes(eng).items()}                      # to warm in the interpreter
                del eng
            out[name] = rows
            if opts.hang == "pass_times":   # dry runs only: a stop mid-section (tests of the rows it keeps)
                _hang()
        del ckpt, backend                   # before `_at_shapes` empties the device cache
    return out


def pass_profile(opts: DeviceCheckOptions, dev: str) -> dict:
    """Where each pass's GPU time goes (edge.analysis.pass_profile): per model and pass, the kernels' time and
    launches by family against the pass's wall time, for the engine form a decode step runs (CUDA-graph replays; the
    static passes where the profiler recorded no kernel inside a replay, `form` says which)."""
    from edge.analysis.pass_profile import profile_pass
    from edge.backends.triton_graphs import GraphedEngine
    out = {}
    cuda = dev == "cuda"
    for name, capacity, prompt, ckpt, backend in _at_shapes(opts, dev):
        rows = {}
        for graphs in ((True, False) if cuda else (False,)):
            eng = GraphedEngine(ckpt, backend, capacity, scratch=GAMMA + 4, graphs=graphs)
            eng.prefill(prompt)
            rows = {"form": "graphs" if graphs else "static"} | \
                {k: profile_pass(fn, opts.repeats, cuda, warm=not opts.dry) for k, fn in _passes(eng).items()}
            del eng
            if rows["target"]["launches"] > 0:
                break
        out[name] = rows
        del ckpt, backend                   # before `_at_shapes` empties the device cache
    return out


def projection(times: dict) -> dict:
    """Speculative speed-up over target-only decoding that the pass times give at the real model's measured
    tokens per round (fixed γ = 4): tokens_per_round * t_target / (γ t_draft + t_verify)."""
    sweep = json.loads(SWEEP.read_text())["speculation_sweep"][f"fixed-g{GAMMA}"]
    tpr = sweep["tokens_per_round"]
    out = {"tokens_per_round": tpr, "acceptance": sweep["acceptance"], "source": str(SWEEP.relative_to(ROOT))}
    for name, forms in times.items():
        out[name] = {form: round(tpr * t["target_ms"] / (GAMMA * t["draft_ms"] + t["verify_ms"]), 3)
                     for form, t in forms.items()}
    return out


def tensorrt_section(opts: DeviceCheckOptions) -> dict:
    """The engine against the independent reference (export.trt.check in its own process, bounded by the section's
    limit): its JSON object, or {"status": "skipped", "reason"} where TensorRT is absent (outside a dry run with a
    checkpoint, which runs the onnxruntime stand-in), or {"status": "failed", "reason"} where it could not run."""
    import subprocess

    from plugins.trt.plugins import tensorrt_unavailable
    reason, engine = tensorrt_unavailable(), "tensorrt"
    if reason:
        if not (opts.dry and opts.checkpoint):
            return {"status": "skipped", "reason": reason}
        engine = "onnxruntime"
    cmd = [sys.executable, "-m", "export.trt.check", "--engine", engine, "--json"]
    for flag, value in (("--checkpoint", opts.checkpoint), ("--onnx", opts.onnx),
                        ("--hang", TRT_HANG_PHASE if opts.hang == "tensorrt" else None)):
        if value:
            cmd += [flag, value]
    limit = max(1.0, opts.limit("tensorrt") - TRT_STOP_MARGIN)  # stopped before the section's own alarm, to name it
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=limit)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        running, done = read_phases(err)
        where = f"in its {running} phase" if running else "before its first phase"
        return {"status": "failed", "reason": f"timed out after {limit:g} s {where}", "phase": running,
                "phase_seconds": done}
    lines = out.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, ValueError):
        last = (out.stderr.strip().splitlines() or [f"exit {out.returncode}, no output"])[-1]
        return {"status": "failed", "reason": last[:400]}


def run_device_check(opts: DeviceCheckOptions, out: Path | None = None) -> dict:
    """Every chosen section, each timed and within its limit; a section that raises or runs out of time is
    recorded with its error and the rest still run. With `out`, the JSON is rewritten before and after each one."""
    import torch
    if not opts.dry and not torch.cuda.is_available():
        raise BitNestError("device_check needs a CUDA GPU (none found): run it there, or --dry here")
    if opts.dry and os.environ.get("TRITON_INTERPRET") != "1":
        raise BitNestError("--dry runs the kernels in the Triton interpreter: set TRITON_INTERPRET=1 before Python starts")
    dev = "cpu" if opts.dry else "cuda"
    result = {"dry": opts.dry, "complete": False, "environment": environment(), "pass_checkpoint": PASS_CHECKPOINT}
    if not opts.dry and not opts.skip_7b:
        reason = seven_b_skip_reason(torch.cuda.get_device_properties(0).total_memory)
        if reason:
            opts = replace(opts, skip_7b=True)
            result["llama-2-7b"] = reason
    elif not opts.dry:
        result["llama-2-7b"] = "skipped: opt-in (--with-7b)"

    def save():
        if out is not None:
            write_atomic(json.dumps(result, indent=1).encode(), out)

    kept = {"bandwidth": {}, "pass_times": {}}     # their rows as each is measured: kept where one stops at its limit
    run = {"kernels": lambda: kernels(opts), "bandwidth": lambda: bandwidth(opts, kept["bandwidth"]),
           "prefill": lambda: prefill(opts), "lossless": lambda: lossless(opts, dev),
           "pass_times": lambda: pass_times(opts, dev, kept["pass_times"]),
           "profile": lambda: pass_profile(opts, dev),
           "plugins": lambda: plugins_section(opts.limit("plugins"), dry=opts.dry),
           "tensorrt": lambda: tensorrt_section(opts), "gptq": lambda: gptq_section(opts.limit("gptq"), dry=opts.dry)}
    for name in opts.chosen:
        result["running"] = name
        save()
        t0 = time.time()
        try:
            hang = opts.hang == name and name not in ("tensorrt", "pass_times")   # those hang in their own code
            result[name] = _within(opts.limit(name), _hang if hang else run[name])
        except (Exception, SectionTimeout) as e:             # one broken section must not cost the others
            result[name] = {"error": f"{e.__class__.__name__}: {e}"}
            if kept.get(name):                                   # the rows done stay, the stop is named
                result[name], result[f"{name}_stopped"] = kept[name], result[name]["error"]
        result[name + "_seconds"] = round(time.time() - t0, 1)
        print(f"device_check: {name} done in {result[name + '_seconds']} s", file=sys.stderr, flush=True)
        save()
    result.pop("running", None)
    if "error" not in result.get("pass_times", {"error": "not run"}):
        result["projection"] = projection(result["pass_times"])
        result["step_bandwidth"] = step_bandwidth(result, opts)
    if "error" not in result.get("profile", {"error": "not run"}):
        result["gemv_in_pass"] = gemv_in_pass(result, opts)
    verdicts = [VERDICTS[s](result[s]) for s in VERDICTS if s in opts.chosen]
    result.setdefault("tensorrt", {"status": "not run", "reason": "not among --sections"})
    for s, flag in OPT_IN.items():
        if s not in opts.chosen and s in opts.sections:
            result[s] = {"status": "not run", "reason": f"opt-in ({flag})"}
    result["sections"] = {s: section_status(s, result.get(s), s in opts.chosen) for s in SECTIONS}
    for name in (n for n in kept if f"{n}_stopped" in result):
        result["sections"][name] = {"status": "stopped", "reason": result[f"{name}_stopped"]}
    result["passed"] = bool(verdicts) and all(verdicts)
    result["complete"] = True
    save()
    return result


def section_status(name: str, r: dict | None, chosen: bool) -> dict:
    """One section's outcome for the JSON's summary: passed / failed (a verdict), skipped / error with the reason,
    measured (a section that times, with no verdict), PLUMBING (a dry run's figures, no verdict), or not run."""
    if r is not None and r.get("status") == "not run":
        return {"status": "not run", "reason": r.get("reason")}
    if not chosen or r is None:
        return {"status": "not run", "reason": "not among --sections"}
    if "error" in r:
        return {"status": "error", "reason": r["error"]}
    if r.get("status") in ("skipped", PLUMBING):
        return {"status": r["status"], "reason": r.get("reason")}
    if name in VERDICTS:
        return {"status": "passed" if VERDICTS[name](r) else "failed", "reason": r.get("reason")}
    return {"status": "measured", "reason": None}
