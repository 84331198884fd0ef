"""The proxy on what the triton backend really launches (plugins/kernels/launches.py, `bitnest compile-kernels
--launches`): every launch of a speculative round and of target and draft steps on the default model goes through
Triton's own launch path for sm_87 without a GPU, compiles, meets the budgets of the specs it mirrors, and matches
them; the capture leaves Triton as it found it, parses a launch's options as a device would, and catches a launcher
change the hand-written specs would not."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}    # the compiler, not the interpreter

LAUNCHED = {"decode_gemv_kernel", "flash_decode_kernel", "chunk_reduce_kernel", "rms_norm_decode_kernel",
            "swiglu_decode_kernel", "rope_write_kv_kernel", "gemm_kernel", "flash_prefill_kernel"}


def _child(code: str, *args: str) -> str:
    run = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=ENV, cwd=ROOT,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip().splitlines()[-1]


def test_every_launch_of_the_default_models_passes_compiles_for_sm87_within_its_budgets(rtn_checkpoint, tmp_path):
    """The default model's passes through the triton backend (a prefill chunk, a draft pass, a 5-token verification,
    a target and a draft step): every kernel family of a decode layer is launched, each variant compiles for sm_87
    with no spill, the decode GEMVs of both views and both group sizes meet BUDGETS and flash decoding and the prefill
    tile theirs; each launched decode GEMV and flash-decoding variant carries the constants, warps and register cap
    of the spec `bitnest compile-kernels` holds for it (the split of K aside, which each linear's shape sets)."""
    from plugins.kernels import aot
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "compile_kernels.py"), "--arch", "sm_87",
                          "--launches", str(rtn_checkpoint), "--out", str(tmp_path), "--json"],
                         capture_output=True, text=True, env=ENV, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["budgets_met"] and result["launches"] == str(rtn_checkpoint)
    rows = result["kernels"]
    assert LAUNCHED <= {r["kernel"].split("_kernel")[0] + "_kernel" for r in rows}
    assert all(r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0 for r in rows), rows
    assert all(r["constexprs"]["PDL"] is False and r["dependent_launch"] == "none" for r in rows), rows   # no PDL
    decode = [r for r in rows if r["kernel"].startswith("decode_gemv_kernel")]
    seen = {(r["constexprs"]["TARGET"], r["constexprs"]["M"], r["constexprs"]["G"]) for r in decode}
    assert {(False, 1, 64), (False, 1, 128), (True, 1, 64), (True, 1, 128), (True, 5, 64), (True, 5, 128)} <= seen
    for r in decode:
        c = r["constexprs"]
        assert r["held"] and r["budget_failures"] == [] and r["registers"] <= aot.BUDGETS["registers"], r
        assert not c.get("PREFETCH") and r["prefetches"] == 0, r          # Orin: no PDL, nothing prefetched
        spec = aot._decode("spec", c["TARGET"], c["M"], c["G"], c["RUNTIME_VIEW"], tiled=c["TILED"],
                           residual=c["HAS_RES"])
        drop = lambda d: {k: v for k, v in d.items() if k not in ("PARTIAL", "FUSED_REDUCE", "PDL", "PREFETCH")}
        assert drop(spec.constexprs) == drop(c) and spec.num_warps == r["num_warps"], (spec.constexprs, c)
    flashes = [r for r in rows if r["kernel"].startswith("flash_decode_kernel")]   # by pointer alignment, 1-2
    for flash in flashes:
        c = flash["constexprs"]
        spec = aot._attention("spec", c["D"], c["R"], 87)
        assert {**spec.constexprs, "HKV": c["HKV"], "PDL": False} == c and spec.num_warps == flash["num_warps"]
        assert flash["budget_failures"] == [] and flash["instructions_per_kv8_byte"] > 0
    assert flashes


LATE = """
import triton, triton.language as tl
from plugins.kernels.common import dependent_launch, prefetch_l2
@triton.jit
def late_kernel(x_ptr, y_ptr, PDL: tl.constexpr = False):    # reads before it waits on the launch before it
    v = tl.load(x_ptr + tl.arange(0, 128))
    dependent_launch(PDL)
    tl.store(y_ptr + tl.arange(0, 128), v)
@triton.jit
def prefetching_kernel(x_ptr, y_ptr, PDL: tl.constexpr = False):    # asks L2 for x first, reads it after its wait
    prefetch_l2(x_ptr + tl.arange(0, 128))
    dependent_launch(PDL)
    tl.store(y_ptr + tl.arange(0, 128), tl.load(x_ptr + tl.arange(0, 128)))
"""

CAPTURE = f"LATE = {LATE!r}\n" + """
import json, torch
from triton.runtime import driver
from triton.runtime.jit import JITFunction
from plugins.kernels import decoder_ops, gemv
from plugins.kernels.common import capture_arch
from plugins.kernels.launches import captured_launches
before = (driver._active, JITFunction._do_compile)
x, w = torch.randn(3, 256), torch.randn(256).half()
cpu = torch.device("cpu")
with captured_launches(87, sms=20):
    chosen = gemv._sm_count(cpu)
with captured_launches(90, 85) as launches:      # PTX ISA 8.5: what the proxy's ptxas reads
    inside, sms = capture_arch(), gemv._sm_count(cpu)
    decoder_ops.rms_norm(x, w, 1e-5)
    try:
        decoder_ops.rms_norm_kernel[(1,)](x, w, x, 256, 256, 1e-5, BLOCK=256, ONE=True, not_an_option=1)
        refused = None
    except KeyError as e:
        refused = str(e)
launch, = launches
import sys, tempfile
from pathlib import Path
from plugins.kernels import aot
from plugins.kernels.launches import launch_spec
def order(launch):
    return aot.summarize(launch.kernel, launch_spec(launch, launch.name), Path(tempfile.mkdtemp()), 90)[
        "dependent_launch"]
planted_dir = Path(tempfile.mkdtemp())           # Triton reads a kernel's source from its file
(planted_dir / "planted_pdl.py").write_text(LATE)
sys.path.insert(0, str(planted_dir))
from planted_pdl import late_kernel, prefetching_kernel
with captured_launches(90, 85) as planted:
    late_kernel[(1,)](x, x, PDL=True, launch_pdl=True)
    prefetching_kernel[(1,)](x, x, PDL=True, launch_pdl=True)
pdl = [launch.constexprs.get("PDL"), launch.options.get("launch_pdl"), order(launch), order(planted[0]),
       order(planted[1])]
left = sum(type(k).__name__ == "_NotLaunched" for k in decoder_ops.rms_norm_kernel.device_caches[0][0].values())
print(json.dumps({"inside": inside, "sms": [chosen, sms, gemv._sm_count(cpu)], "after": capture_arch(), "left": left,
                  "restored": before == (driver._active,
                  JITFunction._do_compile), "name": launch.name, "signature": launch.signature,
                  "target": launch.kernel.metadata.target.arch, "refused": refused, "pdl": pdl}))
"""


def test_a_capture_compiles_for_its_arch_parses_options_and_restores_triton():
    """Under a capture for sm_90 a real launcher's kernel is compiled for sm_90 with the argument types of its call
    and recorded, nothing runs, an option Triton does not know is refused as on a device, the GEMV's split of K is
    planned for the captured GPU's SMs, and afterwards Triton's driver and compile path are as before, with no
    capture in progress and no cached launch left that would do nothing."""
    out = json.loads(_child(CAPTURE))
    assert out["inside"] == 90 and out["after"] is None and out["restored"] and out["left"] == 0, out
    assert out["sms"] == [20, 132, 8], out     # the split of K planned for the GPU captured (an H200's by default)
    assert out["name"] == "rms_norm_kernel" and out["target"] == 90, out
    assert out["signature"]["x_ptr"] == "*fp32" and out["signature"]["w_ptr"] == "*fp16", out
    assert out["refused"] and "not_an_option" in out["refused"], out
    # sm_90 launches with programmatic dependent launch, and its SASS waits on the launch before it before it
    # touches global memory; a kernel that loads before its wait is caught, one that only prefetches is told apart
    assert out["pdl"] == [True, True, "wait first", "late", "prefetch, then wait"], out


HOPPER = """
import json, os, sys
from edge.analysis.kernel_launches import backend_launches
from plugins.kernels.common import PDL_ENV, PREFETCH_ENV, env_off, pdl
from plugins.kernels.launches import captured_launches
launches = backend_launches(sys.argv[1], 90, compile_them=False)
with captured_launches(90, compile_them=False), env_off(PDL_ENV):      # the device check's graphs_no_pdl form
    off = pdl("cpu", prefetch=True)
with captured_launches(90, compile_them=False), env_off(PDL_ENV, False):
    kept = pdl("cpu")
with captured_launches(90, compile_them=False), env_off(PREFETCH_ENV):    # its graphs_no_prefetch form
    no_prefetch = pdl("cpu", prefetch=True)
with captured_launches(87, compile_them=False):
    orin = pdl("cpu", prefetch=True)
print(json.dumps({"launches": [[x.name, x.constexprs.get("PDL"), x.options.get("launch_pdl")] for x in launches],
                  "prefetch": sorted({x.name for x in launches if x.constexprs.get("PREFETCH")}),
                  "switch": [off, kept, no_prefetch, orin, os.environ.get("BITNEST_PDL"),
                             os.environ.get(PREFETCH_ENV)]}))
"""


def test_on_hopper_every_launch_of_the_default_models_passes_is_a_dependent_launch(rtn_checkpoint):
    """Every kernel the triton backend launches in a prefill chunk, a speculative round and target and draft steps is
    launched for sm_90 with programmatic dependent launch (its PDL constant and the launch attribute: a launcher that
    forgets either is caught); the decode GEMV, and only it, with its weights' L2 prefetch before the wait (PREFETCH),
    which BITNEST_PDL_PREFETCH=0 turns off with PDL kept (the `graphs_no_prefetch` form); BITNEST_PDL=0 launches none
    with PDL, nor does `env_off(PDL_ENV)` (the device check's `graphs_no_pdl` form), which puts the switch back; sm_87 has
    none. (Recorded, not compiled: the compiled kernels' order is `compile-kernels --arch sm_90`'s `dependent_launch`
    column and the tests above and in test_compile_kernels.py.)"""
    result = json.loads(_child(HOPPER, str(rtn_checkpoint)))
    on = result["launches"]
    assert LAUNCHED <= {name for name, _, _ in on}, on
    pdl = {"PDL": True, "launch_pdl": True}      # env_off turns it off and puts the switch back; Orin has none
    assert result["switch"] == [{}, pdl, pdl, {}, None, None], result["switch"]
    assert result["prefetch"] == ["decode_gemv_kernel"], result["prefetch"]     # the weight stream, asked for by
    #                                                                              its launcher; no other kernel
    assert all(flag is True and attr is True for _, flag, attr in on), on
    env = dict(ENV, BITNEST_PDL="0")
    run = subprocess.run([sys.executable, "-c", HOPPER, str(rtn_checkpoint)], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=600)
    off = json.loads(run.stdout.strip().splitlines()[-1])["launches"]
    assert {name for name, _, _ in off} == {name for name, _, _ in on}, (on, off)
    assert all(not flag and not attr for _, flag, attr in off), off


PREFILL = """
import json, sys, tempfile
from pathlib import Path
import torch, triton
import plugins.kernels as K
from plugins.kernels import aot, attention, attention_prefill
from plugins.kernels.launches import captured_launches, launch_spec
from plugins.kv import quantize_kv
if sys.argv[1] == "planted":       # the output strides specialized again, as the launcher once had them
    attention.flash_prefill_kernel = attention_prefill.flash_prefill_kernel = triton.jit(
        do_not_specialize=["T"])(attention_prefill.flash_prefill_kernel.fn)
hq, hkv, d, t = 9, 3, 64, 64                      # the default model's heads, a prefill chunk of 64 queries
kv = quantize_kv(torch.randn(2, hkv, 320, d))
with captured_launches(87, aot.JETPACK6_PTX) as launches:
    K.nested_kv_attention(torch.randn(hq, t, d), *kv, 256, 0)
launch, = [x for x in launches if x.name == "flash_prefill_kernel"]
row = aot.summarize(launch.kernel, launch_spec(launch, "prefill"), Path(tempfile.mkdtemp()), 87)
print(json.dumps({k: row[k] for k in ("registers", "spill_store_bytes", "budget_failures")}))
"""


def test_the_capture_catches_the_prefill_tile_spill_its_spec_did_not_show():
    """The prefill tile at the default model's heads, as its launcher calls it, meets its budgets on sm_87; with its
    output strides specialized again (16-divisible in every real launch, never in the hand-written spec, which
    compiled it without a spill) Triton vectorizes the tile's output store and it spills, which the capture sees."""
    real = json.loads(_child(PREFILL, "real"))
    assert real["spill_store_bytes"] == 0 and real["budget_failures"] == [], real
    planted = json.loads(_child(PREFILL, "planted"))
    assert planted["spill_store_bytes"] > 0 and any("spills" in f for f in planted["budget_failures"]), planted


def test_launches_of_an_unknown_model_or_sms_without_launches_are_one_line_errors():
    """`--launches` names a checkpoint folder or a model preset; anything else, or `--sms` without it, is one line
    naming the fix, exit 2 (a usage error), no traceback."""
    for args, says in ((["--launches", "no-such-model"], "no checkpoint folder there and no model preset"),
                       (["--sms", "20"], "give it with --launches")):
        run = subprocess.run([sys.executable, str(ROOT / "scripts" / "compile_kernels.py"), "--arch", "sm_87", *args],
                             capture_output=True, text=True, env=ENV, timeout=300)
        lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
        assert run.returncode == 2 and says in run.stderr and "Traceback" not in run.stderr, run.stderr
        assert len([ln for ln in lines if "compile_kernels.py" in ln]) == 1, run.stderr
