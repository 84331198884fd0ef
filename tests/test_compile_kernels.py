"""Every kernel compiles for Orin (sm_87) without a GPU, with PTX that JetPack 6's CUDA 12.6 driver loads; the decode
GEMVs, the prefill GEMMs and the flash-decoding kernels meet their proxy budgets (plugins/kernels/aot.py), and the checks
fail where a regression is planted."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def compile_kernels(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}   # the compiler, not the interpreter
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "compile_kernels.py"), *args],
                          capture_output=True, text=True, env=env, timeout=900)


def compile_planted(tmp_path: Path, code: str) -> list:
    """Run `code` (it compiles specs and prints one JSON list) in a child with the compiler, not the interpreter,
    and the planted modules written in tmp_path importable; its JSON."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_compile_kernels_for_sm87(tmp_path):
    """Every kernel compiles for sm_87 with JetPack 6's PTX ISA, nothing spills, and every decode GEMV meets the
    bandwidth budgets of plugins.kernels.aot.BUDGETS (<= 128 registers, <= 4 lane instructions per weight byte in
    its main loop, dp4a on CUDA cores, 128-bit plane loads); the tensor-core kernel, which decoded before, misses
    them (the budget check can fail: putting it back as the decode kernel fails this test)."""
    from plugins.kernels.aot import ATTENTION_BUDGETS, BUDGETS, budget_failures
    out = compile_kernels("--arch", "sm_87", "--out", str(tmp_path), "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    rows = {r["kernel"]: r for r in result["kernels"]}
    decode = {"decode_draft_m1", "decode_target_m1", "decode_target_m5", "decode_target_m8", "decode_runtime_view_m1",
              "decode_runtime_view_m5", "decode_runtime_view_canonical_m5", "decode_target_m1_residual",
              "decode_target_m8_residual", "decode_draft_m1_g64", "decode_target_m5_g64", "decode_target_m8_g64",
              "decode_draft_m1_g32", "decode_target_m5_g32"}
    prefill = {"gemm_draft_m64", "gemm_target_m64", "gemm_target_m64_g64", "gemm_target_m64_runs",
               "gemm_runtime_view_m64", "gemm_target_m64_canonical"}
    assert decode | prefill | {"flash_decode_d128_gqa4", "write_kv_d128", "quantize_decode"} <= rows.keys()
    for name in ("swiglu_r4_344x32", "swiglu_r4_28x512", "swiglu_r4_140x64"):   # the MLP's one launch a layer
        assert rows[name]["registers"] <= 128 and rows[name]["spill_load_bytes"] == 0, rows[name]
    for name, r in rows.items():
        assert r["ptx_isa"] == "8.5" and r["target"] == "sm_87", name
        assert (tmp_path / f"{name}.ptx").stat().st_size > 0 and (tmp_path / f"{name}.cubin").stat().st_size > 0
        assert r["registers"] and r["registers"] <= 255 and r["spill_store_bytes"] == 0, name
    for name in decode:
        r = rows[name]
        assert r["budget_failures"] == [] and budget_failures(r) == [] and r["held"], (name, r)
        assert r["instructions_per_weight_byte"] <= BUDGETS["instructions_per_weight_byte"] and r["loop_ldg128"] > 0
        assert r["shared_bytes"] <= 16 and r["imma"] == r["hmma"] == 0, name    # no tile staged (the split
            # reduction's counter read, one scalar broadcast through shared memory), no tensor cores
    # the target's loop loads both planes: twice the draft's 128-bit plane loads per row at one token
    assert rows["decode_target_m1"]["loop_ldg128"] - rows["decode_draft_m1"]["loop_ldg128"] == 4
    mma = budget_failures(rows["gemm_target_m64"])      # a tensor-core tile of 64 tokens is no decode kernel
    assert any("registers" in f for f in mma) and any("per weight byte" in f for f in mma), mma
    for name in prefill:   # a prefill chunk: tensor cores, and per token a fraction of the decode kernel's issue
        r = rows[name]
        assert r["budget_failures"] == [] and r["held"] and r["loop_imma"] > 0 and r["loop_tokens"] == 64, (name, r)
        assert r["instructions_per_weight_byte_token"] < rows["decode_target_m8"]["instructions_per_weight_byte"] / 16
    assert rows["gemm_target_m64"]["loop_imma"] == 2 * rows["gemm_draft_m64"]["loop_imma"] > 0   # the second plane
    assert rows["gemm_draft_w4a16_m16"]["hmma"] > 0 and rows["flash_decode_d128_gqa4"]["hmma"] > 0
    assert json.loads((tmp_path / "summary.json").read_text())["arch"] == "sm_87" and result["budgets_met"]
    for name in ("flash_decode_d128_mha", "flash_decode_d128_gqa4", "flash_decode_d64_gqa3"):
        r = rows[name]       # KV4 loops (base plane) then KV8 loops (both planes), whole steps then edge steps
        assert r["budget_failures"] == [] and r["attention_loops"] == 4, (name, r)
        assert 0 < 2 * r["kv4_loop_plane_loads"] == r["kv8_loop_plane_loads"], (name, r)
        assert r["kv8_loop_instructions"] < r["kv8_edge_loop_instructions"], (name, r)
        assert r["instructions_per_kv8_byte"] <= ATTENTION_BUDGETS["instructions_per_kv8_byte"]
        assert r["registers"] <= 128, (name, r)
    for name in ("flash_prefill_d128_mha", "flash_prefill_d128_gqa4", "flash_prefill_d64_gqa3"):
        r = rows[name]       # a prefill chunk's tile: the same loops; per KV byte and row no more than decoding's
        assert r["budget_failures"] == [] and r["attention_loops"] == 4 and r["prefill_tile"], (name, r)
        assert 0 < 2 * r["kv4_loop_plane_loads"] == r["kv8_loop_plane_loads"], (name, r)
        assert r["tile_rows"] >= 32 and r["spill_store_bytes"] == 0, (name, r)
        decode = rows[name.replace("prefill", "decode")]
        per_row = r["instructions_per_kv8_byte"] / r["tile_rows"]
        assert per_row < decode["instructions_per_kv8_byte"] / decode["tile_rows"], (name, per_row, decode)


def test_the_budget_check_catches_a_decode_kernel_without_128_bit_loads(tmp_path):
    """The decode kernel compiled without the alignment Triton's launcher proves at run time (what a plane view at
    an odd offset, or a lost `multiple_of` hint, would give) loads its planes 32 bits at a time: the proxy counts
    more instructions per weight byte and no 128-bit load, and the budget check names it."""
    from plugins.kernels.aot import budget_failures
    code = ("import json, sys; from dataclasses import replace; from pathlib import Path; "
            "from plugins.kernels.aot import compile_spec, kernel_specs; "
            "spec = next(s for s in kernel_specs() if s.name == 'decode_target_m1'); out = Path(sys.argv[1]); "
            "print(json.dumps([compile_spec(spec, out), compile_spec(replace(spec, name='unaligned', aligned=False), "
            "out)]))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}   # the compiler, not the interpreter
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    aligned, loose = json.loads(run.stdout.strip().splitlines()[-1])
    assert aligned["budget_failures"] == [] and aligned["loop_ldg128"] > 0
    assert loose["loop_ldg128"] == 0 and any("128-bit" in f for f in budget_failures(loose)), loose
    assert loose["instructions_per_weight_byte"] > aligned["instructions_per_weight_byte"]


def test_the_attention_budget_catches_a_refinement_load_in_the_kv4_loop_and_masked_whole_steps(tmp_path):
    """The flash-decoding kernel with each defect its loops exist to avoid put back, copies of attention.py and
    kv_codes.py with a line or two changed: its code unpacking loading the refinement plane at KV4 positions too
    (the proxy counts as many plane loads in the KV4 loops as in the KV8 loops), and its whole steps run as edge
    steps (clamp, plane choice and mask back in the loops of whole steps: as many instructions there as in the edge
    loops). The budget check names each."""
    source = (ROOT / "plugins" / "kernels" / "attention.py").read_text()
    codes = (ROOT / "plugins" / "kernels" / "kv_codes.py").read_text()
    refine, whole = "    if KV8:\n        qx = ", ("WHOLE=True)", "WHOLE=False)")
    helpers = "from plugins.kernels.kv_codes "
    assert codes.count(refine) == 1 and codes.count(whole[0]) == 2 and source.count(helpers) == 1
    for name, planted in (("refine", codes.replace(refine, "    if True:\n        qx = ")),
                          ("whole", codes.replace(*whole))):
        (tmp_path / f"planted_codes_{name}.py").write_text(planted)
        (tmp_path / f"planted_{name}.py").write_text(source.replace(helpers, f"from planted_codes_{name} "))
    code = ("import json, sys; from dataclasses import replace; from pathlib import Path; "
            "import planted_refine, planted_whole; "
            "from plugins.kernels.aot import compile_spec, kernel_specs; out = Path(sys.argv[1]); "
            "spec = next(s for s in kernel_specs() if s.name == 'flash_decode_d128_mha'); "
            "print(json.dumps([compile_spec(spec, out)] + [compile_spec(replace(spec, name=m.__name__, "
            "fn=m.flash_decode_kernel), out) for m in (planted_refine, planted_whole)]))")
    shipped, planted, masked = compile_planted(tmp_path, code)
    assert shipped["budget_failures"] == []
    assert planted["kv4_loop_plane_loads"] == planted["kv8_loop_plane_loads"] > 0, planted
    assert any("KV4 loop" in f for f in planted["budget_failures"]), planted
    assert masked["kv4_loop_instructions"] >= masked["kv4_edge_loop_instructions"], masked
    assert any("whole steps" in f for f in masked["budget_failures"]), masked


def test_the_prefill_budget_catches_plane_bytes_unpacked_one_at_a_time(tmp_path):
    """The prefill GEMM with its nibble unpacking put back as Triton's int8 shifts (a byte at a time, the form the
    interpreter runs), a copy of gemm.py with one line changed: the proxy counts over twice the lane instructions
    per weight byte and the budget check names it."""
    source = (ROOT / "plugins" / "kernels" / "gemm.py").read_text()
    fast = "    if INTERP:\n        return (p << 4)"
    assert source.count(fast) == 1
    (tmp_path / "planted_bytes.py").write_text(source.replace(fast, "    if True:\n        return (p << 4)"))
    code = ("import json, sys; from dataclasses import replace; from pathlib import Path; import planted_bytes; "
            "from plugins.kernels.aot import compile_spec, kernel_specs; out = Path(sys.argv[1]); "
            "spec = next(s for s in kernel_specs() if s.name == 'gemm_target_m64'); "
            "print(json.dumps([compile_spec(spec, out), compile_spec(replace(spec, name='planted', "
            "fn=planted_bytes.gemm_kernel), out)]))")
    shipped, planted = compile_planted(tmp_path, code)
    assert shipped["budget_failures"] == []
    assert planted["instructions_per_weight_byte"] > 2 * shipped["instructions_per_weight_byte"], planted
    assert any("per weight byte" in f for f in planted["budget_failures"]), planted


def test_a_hopper_gemm_counts_its_warpgroup_mmas(tmp_path):
    """For sm_90 Triton runs a prefill GEMM's tl.dot on the warpgroup MMAs (IGMMA in the SASS, where sm_87 has IMMA):
    the proxy counts them as the main loop's matrix instructions, so `--arch sm_90` does not report a tensor-core
    kernel as having none (what it reported while only IMMA and HMMA were matched)."""
    code = ("import json, sys; from pathlib import Path; from plugins.kernels.aot import compile_spec, kernel_specs; "
            "spec = next(s for s in kernel_specs(90) if s.name == 'gemm_target_m64_canonical'); "
            "print(json.dumps([compile_spec(spec, Path(sys.argv[1]), 90)]))")
    (row,) = compile_planted(tmp_path, code)
    assert row["target"].startswith("sm_90") and row["imma"] == row["loop_imma"] > 0 and row["hmma"] == 0, row
    assert row["budget_failures"] == [], row


def test_a_hopper_decode_gemv_prefetches_its_weights_before_its_wait_and_nothing_else(tmp_path):
    """For sm_90 (programmatic dependent launch) the decode GEMV asks L2 for its first weight bytes before it waits on
    the launch before it: its SASS holds only prefetches before the wait (no load, no branch), one a thread for each
    of the first 8 chunks of each plane and each of the 2 groups' scales (18 at the target's G = 128), the base plane
    and scales only (10) where the view is read on the device after the wait; without PREFETCH the wait comes first
    and nothing is prefetched; with it the kernel keeps its budgets (sm_87 has no PDL: its code is unchanged)."""
    code = ("import dataclasses, json, sys; from pathlib import Path; "
            "from plugins.kernels.aot import compile_spec, kernel_specs; "
            "specs = {s.name: s for s in kernel_specs(90)}; t = specs['decode_target_m1']; "
            "plain = dataclasses.replace(t, name='plain', signature=t.signature | {'PREFETCH': 'constexpr'}, "
            "constexprs=t.constexprs | {'PREFETCH': False}); "
            "print(json.dumps([compile_spec(s, Path(sys.argv[1]), 90) "
            "for s in (t, specs['decode_runtime_view_m1'], plain)]))")
    target, runtime_view, plain = compile_planted(tmp_path, code)
    assert target["dependent_launch"] == "prefetch, then wait" and target["prefetches"] == 18, target
    assert runtime_view["dependent_launch"] == "prefetch, then wait" and runtime_view["prefetches"] == 10, runtime_view
    assert plain["dependent_launch"] == "wait first" and plain["prefetches"] == 0, plain
    assert target["budget_failures"] == [] and runtime_view["budget_failures"] == [], (target, runtime_view)


def test_compile_kernels_exits_1_naming_a_kernel_over_budget(tmp_path):
    """Without --out the kernels go to a new temporary folder; a budget the shipped kernels cannot meet (a register
    cap of 16, set in the module's table) makes the command exit 1 with one line naming the kernel over it."""
    code = ("import sys; from plugins.kernels import aot; from export.commands.compile_kernels import main; "
            "real = aot.kernel_specs; "
            "aot.kernel_specs = lambda *a: [s for s in real(*a) if s.name == 'decode_draft_m1']; "
            "aot.BUDGETS['registers'] = int(sys.argv[1]); sys.exit(main(['--json']))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TMPDIR": str(tmp_path)}
    runs = {cap: subprocess.run([sys.executable, "-c", code, str(cap)], capture_output=True, text=True, env=env,
                                cwd=ROOT, timeout=600) for cap in (128, 16)}
    met = json.loads(runs[128].stdout.strip().splitlines()[-1])
    assert runs[128].returncode == 0 and met["budgets_met"] and Path(met["out"], "summary.json").is_file()
    assert Path(met["out"]).parent == tmp_path
    assert runs[16].returncode == 1 and json.loads(runs[16].stdout.strip().splitlines()[-1])["budgets_met"] is False
    over = [ln for ln in runs[16].stderr.splitlines() if "over budget" in ln]
    assert len(over) == 1 and re.fullmatch(r"compile_kernels\.py: over budget: decode_draft_m1: \d+ registers > 16",
                                           over[0]), runs[16].stderr[-1000:]


def test_ptx_that_ptxas_refuses_is_one_line_naming_it(tmp_path):
    """ptxas's refusal of a kernel's PTX (here a file that is no PTX) is a ValueError naming the file and ptxas's own
    line, which the command prints as its one-line error, not a traceback."""
    import pytest
    from plugins.kernels.aot import ptxas_usage
    bad = tmp_path / "broken.ptx"
    bad.write_text(".version 8.5\n.target sm_87\n.address_size 64\nthis is not ptx\n")
    with pytest.raises(ValueError, match=r"ptxas refused broken\.ptx for sm_87: .*(error|fatal)"):
        ptxas_usage(bad, 87)


def test_compile_kernels_rejects_a_bad_arch(tmp_path):
    out = compile_kernels("--arch", "ampere", "--out", str(tmp_path))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "sm_87" in out.stderr


def selfcheck(*args: str, interpret: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRITON_INTERPRET=interpret)
    return subprocess.run([sys.executable, "-m", "edge.checks.kernels", *args, "--json"], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=900)


def test_kernel_selfcheck_passes_on_real_planes(small_llama_checkpoint):
    """The command on a real export's planes (the small Llama's: the interpreter runs them in seconds where the
    default model's take half a minute; tests/test_kernels.py runs the default model's shapes and GQA 3:1)."""
    out = selfcheck("--checkpoint", str(small_llama_checkpoint), interpret=os.environ["TRITON_INTERPRET"])
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 0 and result["passed"], result
    names = " ".join(c["name"] for c in result["checks"])
    assert "q_proj M=5 target int8" in names and "down_proj M=1 draft float16" in names and "kv4" in names
    assert "dual_plane_linear_tiled model.layers.0.mlp.down_proj M=5 target equals canonical" in names
    assert len(result["checks"]) == 28 and all(c["passed"] for c in result["checks"])   # 16 GEMV, 8 tiled, 4 KV


def test_kernel_selfcheck_reports_why_it_cannot_run(tmp_path):
    import pytest
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the kernels can run")
    out = selfcheck(interpret="0")
    assert out.returncode == 2 and "no CUDA GPU" in json.loads(out.stdout.strip())["reason"]


def test_kernel_selfcheck_rejects_a_bad_checkpoint(tmp_path):
    out = selfcheck("--checkpoint", str(tmp_path), interpret="1")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert str(tmp_path) in json.loads(out.stdout.strip())["reason"]


def test_bench_kernels_without_a_gpu_says_so():
    import pytest
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the benchmark runs (minutes)")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_kernels.py"), "--json"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "needs a CUDA GPU" in out.stderr
