"""The device self-check: every decode path this machine supports (torch, cpu, triton or the Triton
interpreter, onnxruntime, tensorrt, each energy meter) run on a real prompt for a few tokens and compared
with the reference (the torch backend's target-only greedy tokens); each path is reported passed, failed
or skipped with the reason. The first thing a Jetson owner runs (scripts/selfcheck.py).

A path this machine should have is never skipped: onnxruntime everywhere (a core dependency), and on a Jetson
the triton kernels, the tensorrt backend (TensorRT, a CUDA torch, an engine beside the checkpoint) and the
tegrastats meter; where one cannot run it is `failed`, with why it was expected. So the exit code is 0 only if
every path present passed and every expected path was present."""

import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from edge.decode.config import GenerateConfig
from edge.engine.interface import PassEngine
from edge.decode.generate import generate
from edge.model.checkpoint import load_checkpoint

PATHS = ("torch", "cpu", "triton", "onnxruntime", "tensorrt", "energy")
EXPECT = ("auto", "jetson", "none")
ALWAYS_EXPECTED = ("onnxruntime",)                                       # core dependencies
JETSON_EXPECTED = ("triton", "tensorrt", "energy:tegrastats")          # what JetPack 6 + .[jetson] provide


def is_jetson() -> bool:
    """A Jetson (L4T): its release file, or a Tegra device tree."""
    if Path("/etc/nv_tegra_release").exists():
        return True
    try:
        return b"nvidia,tegra" in Path("/proc/device-tree/compatible").read_bytes()
    except OSError:
        return False


def expected_paths(expect: str) -> tuple[str, ...]:
    """Paths that must run here: `jetson` as on a Jetson, `auto` by what this machine is, `none` only the core."""
    jetson = expect == "jetson" or (expect == "auto" and is_jetson())
    return ALWAYS_EXPECTED + (JETSON_EXPECTED if jetson else ())
# The ONNX graph reproduces the torch backend's quantizer inputs bit for bit (see tests/test_onnx.py).
ONNX_MAX_REL_ERR = 1e-3


@dataclass
class PathResult:
    path: str
    status: str                      # passed | failed | skipped
    reason: str | None = None
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class SelfCheckOptions:
    checkpoint: str
    onnx: str | None = None          # step graph for the onnxruntime path (None: skipped)
    engine: str | None = None        # TensorRT engine (default CHECKPOINT/decoder_step.engine)
    tokens: int = 4
    paths: tuple[str, ...] = PATHS
    triton_timeout: int = 600
    expect: str = "auto"             # which paths must run here (EXPECT)

    def __post_init__(self):
        bad = [p for p in self.paths if p not in PATHS]
        if bad:
            raise ValueError(f"unknown path {bad[0]!r}: use {', '.join(PATHS)}")
        if self.expect not in EXPECT:
            raise ValueError(f"unknown --expect {self.expect!r}: use {', '.join(EXPECT)}")
        if self.tokens < 1:
            raise ValueError("--tokens must be at least 1")


def check_prompt(ckpt) -> list[int]:
    """The checks' real chat prompt in the model's chat template (token ids)."""
    from edge.model.tokenizer import load_tokenizer
    tok = load_tokenizer(ckpt.path)
    return list(tok.apply_chat_template([{"role": "user", "content": "Name three primary colors."}],
                                        add_generation_prompt=True, tokenize=True, return_dict=False))


class _Check:
    """Shared state of one run: the prompt, the reference tokens, configs."""

    def __init__(self, opts: SelfCheckOptions):
        from edge.backends.torch_ref import TorchBackend

        self.opts = opts
        self.ckpt = load_checkpoint(opts.checkpoint)
        self.prompt = check_prompt(self.ckpt)
        self.capacity = len(self.prompt) + opts.tokens + 8
        self.target = GenerateConfig(policy="target", max_new_tokens=opts.tokens)
        self.spec = GenerateConfig(policy="speculative", gamma=4, max_new_tokens=opts.tokens)
        self.reference, _ = generate(PassEngine(self.ckpt, TorchBackend(self.ckpt), self.capacity),
                                     self.prompt, self.target, set())
        self.independent = None      # edge.checks.reference_agreement.ReferenceRun, computed when a path needs it
        self.bound = None            # its prefill logits' bound, from the torch backend's own error

    def agreement(self, tokens: list[int]) -> float:
        return sum(a == b for a, b in zip(tokens, self.reference)) / len(self.reference)

    def lossless(self, make_engine, name: str) -> PathResult:
        """Speculative vs target-only greedy on one backend (lossless), agreement with the reference."""
        spec, stats = generate(make_engine(), self.prompt, self.spec, set())
        target, _ = generate(make_engine(), self.prompt, self.target, set())
        d = {"tokens": spec, "target_tokens": target, "agreement_with_reference": self.agreement(spec),
             "acceptance": stats.summary()["acceptance"]}
        if spec != target:
            return PathResult(name, "failed", "speculative output differs from target-only output", d)
        return PathResult(name, "passed", None, d)

    def against_independent(self, make_engine, r: PathResult) -> PathResult:
        """`r` failed unless the engine's prefill logits and greedy target-only tokens agree with the independent
        step reference (edge.checks.reference_agreement): an engine lossless against itself may still be wrong."""
        from edge.checks.reference_agreement import compare_with_reference, reference_and_bound
        if self.independent is None:
            self.independent, self.bound = reference_and_bound(self.ckpt, self.prompt, self.opts.tokens, self.capacity)
        a = compare_with_reference(make_engine, self.independent, self.prompt, self.bound)
        r.details["independent_reference"] = {**{k: v for k, v in a.items() if k != "agrees"},
                                              "prefill_bound": self.bound}
        if r.status == "passed" and not a["agrees"]:
            return PathResult(r.path, "failed", a["reason"], r.details)
        return r


def check_torch(c: _Check) -> PathResult:
    from edge.backends.torch_ref import TorchBackend
    r = c.lossless(lambda: PassEngine(c.ckpt, TorchBackend(c.ckpt), c.capacity), "torch")
    if r.status == "passed" and r.details["tokens"] != c.reference:
        return PathResult("torch", "failed", "tokens differ from the reference", r.details)
    return r


def check_cpu(c: _Check) -> PathResult:
    from edge.backends.cpu import CpuInt4Backend, cpu_int4_available
    if not cpu_int4_available():
        return PathResult("cpu", "skipped", "this torch build lacks _weight_int4pack_mm_for_cpu")
    ckpt = load_checkpoint(c.opts.checkpoint)   # the cpu backend re-lays its planes in place
    backend = CpuInt4Backend(ckpt)
    r = c.lossless(lambda: PassEngine(ckpt, backend, c.capacity), "cpu")
    r.details["note"] = "bfloat16 activations: agreement with the INT8-activation reference is reported, not required"
    return r


def check_triton(c: _Check) -> PathResult:
    if importlib.util.find_spec("plugins.kernels") is None or importlib.util.find_spec("plugins.kernels.selfcheck") is None:
        return PathResult("triton", "skipped", "plugins.kernels.selfcheck is not in this install (Triton kernels)")
    import torch
    env = dict(os.environ)
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"
    cmd = [sys.executable, "-m", "edge.checks.kernels", "--checkpoint", str(c.ckpt.path), "--json"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=c.opts.triton_timeout,
                             cwd=str(Path(__file__).resolve().parents[2]))
    except subprocess.TimeoutExpired:
        return PathResult("triton", "failed", f"kernel self-check timed out after {c.opts.triton_timeout} s")
    lines = out.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1]) if lines else {}
    except ValueError:
        report = {}
    reason = report.get("reason") or (out.stderr.strip().splitlines() or [None])[-1]
    status = {0: "passed", 1: "failed", 2: "skipped"}.get(out.returncode, "failed")
    return PathResult("triton", status, None if status == "passed" else reason,
                      {"device": report.get("device"), "checks": report.get("checks")})


def check_onnxruntime(c: _Check) -> PathResult:
    if not c.opts.onnx:
        return PathResult("onnxruntime", "skipped", "no ONNX step graph given (scripts/export.py --onnx writes one)")
    from edge.backends.onnxruntime_step import onnxruntime_engine, open_session
    from edge.checks.onnx_check import CheckOptions, check_session, compare

    session = open_session(c.opts.onnx)
    # M is unbounded in onnxruntime: the prompt goes in one pass, as the reference engine's prefill does
    r = c.lossless(lambda: onnxruntime_engine(c.ckpt, c.capacity, max_tokens=len(c.prompt), session=session),
                   "onnxruntime")
    logits = compare(c.ckpt, check_session(c.opts.onnx, c.ckpt.config.num_layers), [c.prompt[:5]],
                     CheckOptions(new_tokens=1, modes=("target-kv8", "draft-kv4")))
    r.details["max_rel_err"] = logits["max_rel_err"]
    if r.status == "passed" and (r.details["tokens"] != c.reference or logits["max_rel_err"] >= ONNX_MAX_REL_ERR):
        return PathResult("onnxruntime", "failed", f"tokens differ from the torch backend or logits from the "
                          f"independent reference (max rel err {logits['max_rel_err']:.2e})", r.details)
    return r


def check_tensorrt(c: _Check) -> PathResult:
    from edge.backends.tensorrt_step import (
        tensorrt_backend_unavailable,
        tensorrt_engine,
    )
    from plugins.step_contract import ENGINE_FILE

    reason = tensorrt_backend_unavailable()
    if reason:
        return PathResult("tensorrt", "skipped", reason)
    engine = Path(c.opts.engine or c.ckpt.path / ENGINE_FILE)
    if not engine.is_file():
        return PathResult("tensorrt", "skipped", f"no engine at {engine}: build it with `python scripts/export.py "
                          f"--out {c.ckpt.path} --existing --engine`")
    make = lambda: tensorrt_engine(c.ckpt, c.capacity, engine)
    r = c.lossless(make, "tensorrt")
    r.details["note"] = "required: lossless, and prefill logits and greedy tokens as the independent reference's"
    return c.against_independent(make, r)


def check_energy(c: _Check) -> list[PathResult]:
    try:
        import edge.energy as energy
    except ImportError as e:
        return [PathResult("energy", "skipped", f"edge.energy is not in this install ({e})")]
    from edge.backends.torch_ref import TorchBackend
    from edge.errors import BitNestError

    out = []
    for name in [m for m in getattr(energy, "METERS", ()) if m not in ("auto", "none")]:
        try:
            meter = energy.make_meter(name)
        except BitNestError as e:
            out.append(PathResult(f"energy:{name}", "skipped", str(e)))
            continue
        try:
            t0 = meter.mark()
            generate(PassEngine(c.ckpt, TorchBackend(c.ckpt), c.capacity), c.prompt, c.target, set())
            reading = meter.energy(t0, meter.mark())
        finally:
            meter.stop()
        d = {k: v for k, v in (asdict(reading) if hasattr(reading, "__dataclass_fields__") else {}).items()}
        joules = d.get("joules", getattr(reading, "joules", None))
        out.append(PathResult(f"energy:{name}", "passed" if joules and joules > 0 else "failed",
                              None if joules and joules > 0 else f"no energy over the decode ({d})", d))
    return out or [PathResult("energy", "skipped", "edge.energy lists no meters")]


_CHECKS = {"torch": check_torch, "cpu": check_cpu, "triton": check_triton, "onnxruntime": check_onnxruntime,
           "tensorrt": check_tensorrt, "energy": check_energy}


def expected_or_skipped(r: PathResult, expected: tuple[str, ...], why: str) -> PathResult:
    """A skipped path that this machine should run is a failed one (the reason says both)."""
    if r.status == "skipped" and r.path in expected:
        return PathResult(r.path, "failed", f"expected {why} but could not run: {r.reason}", r.details)
    return r


def run_selfcheck(opts: SelfCheckOptions) -> dict:
    """{"passed": bool (no path failed), "paths": [PathResult...], "expected", "reference_tokens", "seconds"}."""
    t0 = time.time()
    c = _Check(opts)
    setup = round(time.time() - t0, 1)
    expected = expected_paths(opts.expect)
    why = "on a Jetson" if "tensorrt" in expected else "everywhere (a core dependency)"
    results: list[PathResult] = []
    for name in opts.paths:
        t = time.time()
        try:
            r = _CHECKS[name](c)
        except Exception as e:                      # a path that crashes is a failed path, not a crashed check
            r = PathResult(name, "failed", f"{e.__class__.__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        for one in r if isinstance(r, list) else [r]:
            one = expected_or_skipped(one, expected, why)
            one.details["seconds"] = round(time.time() - t, 1)
            results.append(one)
    ran = {r.path for r in results}
    for name in expected:                            # an expected meter the energy path did not even list
        if name.startswith("energy:") and "energy" in opts.paths and name not in ran:
            results.append(PathResult(name, "failed", f"expected {why}: edge.energy offers no {name[7:]} meter"))
    return {"passed": all(r.status != "failed" for r in results), "paths": [asdict(r) for r in results],
            "expected": list(expected), "reference_tokens": c.reference, "checkpoint": str(c.ckpt.path),
            "reference_seconds": setup, "seconds": round(time.time() - t0, 1)}
