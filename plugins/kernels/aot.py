"""Ahead-of-time compilation of every kernel for a GPU architecture without a GPU (`triton.compile` with an explicit
target), and the resource summary of each: registers and spills (from the bundled ptxas), shared memory (Triton's
metadata), and which matrix instructions the SASS holds (int8 IMMA, float16 HMMA, dp4a; from Hopper on a tensor-core
kernel may issue the warpgroup forms IGMMA / HGMMA instead, counted with them).

Argument types are the ones the launchers pass at run time (activations, queries and new K/V are float32; the
float16-activation GEMV variants take float16), so the registers reported are those of the kernels that run.

The bandwidth proxy (`sass_proxy`, what a developer without a GPU holds every change to): the number of 128-bit
global loads (`LDG.E.128`: a weight chunk of 16 bytes per instruction), and the lane instructions per weight byte of
the main loop (`main_loop`: the weight stream, the loop with the dot instructions): the SASS instructions between
the loop's head and its backward branch, times the threads of a
program, over the plane bytes a program reads per iteration (one group of its rows). Decode GEMVs are held to
BUDGETS (`budget_failures`): on Orin NX (8 SMs x 128 lanes at 918 MHz, 102 GB/s) the issue rate allows ~9 lane
instructions per byte at the roofline, so <= 4 leaves the memory system the bound with room for latency.

The attention proxy (`attention_proxy`): the flash-decoding kernel has four position loops, KV4 positions (base plane
only) then KV8 positions (both planes), each view in whole steps (main positions every query sees: what a long
context streams) then edge steps (the chunk's partial step, the draft's scratch slots, the causal diagonal); for
each, the lane instructions per KV byte it streams (K and V plane bytes of a step of positions), and its plane
loads (a KV4 loop must issue half its KV8 loop's: it never loads the refinement plane). Attention is held to
ATTENTION_BUDGETS (`attention_budget_failures`): no more registers than the launch's cap (128 on sm_87,
`attention.register_cap`), no spill, and per-byte ceilings that the kernel
it replaced (20-27 lane instructions per KV8 byte, 40-53 per KV4 byte) fails, tighter for the whole steps; they are
above the GEMV's 4 because a tensor-core row tile computes 16 rows where one decode query is live. A prefill chunk's
tiles (`attention_prefill`) are held per KV byte and row to PREFILL_ATTENTION_BUDGETS.

PTX ISA version: Triton 3.9 bundles ptxas 12.9 and by default emits PTX ISA 8.8, which the CUDA 12.6 driver of
JetPack 6.1/6.2 cannot JIT (12.6 reads PTX up to ISA 8.5). We pin `ptx_version=85` for sm_87, so the PTX loads on
JetPack 6's driver; the cubins are sm_87 SASS. On the device Triton compiles at run time with the ptxas that
TRITON_PTXAS_PATH names (plugins.kernels.common points it at JetPack's /usr/local/cuda/bin/ptxas when present, so the
PTX version follows the installed CUDA).
"""

import re
from dataclasses import dataclass
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from plugins.kernels import attention, attention_prefill, decoder_ops, gemm, gemv, gemv_decode, kv_write, swiglu
from plugins.kernels.sass import (  # noqa: F401  (ptxas_usage, sass_instructions: read through aot by tests)
    HMMA, IMMA, _plane_loads, _sass, dependent_launch_order, load_loops, main_loop, ptxas_usage, sass_instructions,
)
from plugins.kernels.common import PDL_MIN_CC

JETPACK6_PTX = 85     # PTX ISA 8.5: the newest the CUDA 12.6 driver (JetPack 6.1/6.2) loads
BUDGETS = {"registers": 128, "spill_bytes": 0, "instructions_per_weight_byte": 4.0}   # decode GEMVs, sm_87
ATTENTION_BUDGETS = {"spill_bytes": 0, "instructions_per_kv8_byte": 10.0,
                     "instructions_per_kv4_byte": 20.0, "instructions_per_kv8_byte_edge": 12.0,
                     "instructions_per_kv4_byte_edge": 24.0}                               # flash decoding, sm_87
PREFILL_BUDGETS = {"registers": 255, "spill_bytes": 0, "instructions_per_weight_byte": 10.0}   # prefill GEMMs, sm_87:
# per weight byte of a loop iteration that serves 64 tokens (the decode kernel's 8 tokens: ~3.5); ~9 is Orin's issue
# rate per byte of bandwidth, so a chunk waits on its weight bytes and tensor cores, not on instruction issue. Two
# programs of 4 warps fit an SM's 65,536 registers at any count ptxas gives (255 at most: 256 a thread, as allocated,
# fill it exactly), so no spill is what binds: Triton 3.9 gives the held 64-token GEMMs 108-215 registers, Triton
# 3.8 (the newest with a JetPack 6 wheel, what a Jetson compiles with) 130-238, where a budget of 224 failed them on
# the device's own compiler at no cost in occupancy
PREFILL_ATTENTION_BUDGETS = {"spill_bytes": 0, "tile_rows": 32, "instructions_per_kv8_byte": 0.35,
                             "instructions_per_kv4_byte": 0.7, "instructions_per_kv8_byte_edge": 0.45,
                             "instructions_per_kv4_byte_edge": 0.85}
# a prefill chunk's attention tiles, sm_87: no more registers than the launch's cap (192 there,
# `attention_prefill.prefill_register_cap`), KV read once per 32+ rows, and per KV byte and row of the tile no more
# lane instructions than the decode kernel's 16-row tile spends (d128 MHA: 0.34 / 0.62, edge steps 0.42 / 0.76)
ATTENTION_LOOPS = (("kv4", "", 1), ("kv4", "_edge", 1), ("kv8", "", 2), ("kv8", "_edge", 2))   # in code order


@dataclass(frozen=True)
class KernelSpec:
    """One compiled variant: a kernel, its argument types and the compile-time constants of a decode shape."""

    name: str
    fn: object
    signature: dict
    constexprs: dict
    num_warps: int = 4
    loop_weight_bytes: int = 0      # plane bytes a program reads per main-loop iteration (GEMVs; 0: not a GEMV)
    decode: bool = False            # a decode GEMV: its budget_failures listed (BUDGETS)
    held: bool = True               # its budget failures fail the build (`bitnest compile-kernels` exits 1)
    num_stages: int = 3             # Triton's software-pipelining stages (its default), as the launcher passes
    aligned: bool = True            # pointers specialized as 16-byte aligned (False: what a misaligned call gets)
    maxnreg: int | None = None      # ptxas's register cap, as the launcher passes it
    kv_step_bytes: int = 0          # attention: KV4 plane bytes (K and V) a position loop step streams (KV8: twice)
    prefill: bool = False           # a prefill chunk's tensor-core GEMM: its budget_failures listed (PREFILL_BUDGETS)
    divisible: tuple = ()           # integer arguments the launcher sees as multiples of 16 (Triton specializes them)
    loop_tokens: int = 1            # tokens each weight byte of a main-loop iteration serves (a GEMM's BLOCK_M)

    def attrs(self) -> dict:
        """Every pointer argument 16-byte aligned, as Triton's launcher specializes torch's allocations at run time
        (without it the compiler cannot prove a 128-bit load aligned and the SASS would not be what runs)."""
        if not self.aligned:
            return {}
        return {(i,): [["tt.divisibility", 16]] for i, (name, t) in enumerate(self.signature.items())
                if t.startswith("*") or name in self.divisible}


def _gemm(name, target, g=128, runtime_view=False, float_act=False, tiled=True, m=64, held=True,
          offset=False, one_run=True):
    """The tensor-core kernel (`plugins.kernels.gemm`) for a pass of m tokens: one group of BLOCK_N rows a loop
    iteration, for every BLOCK_M tokens. N and K are multiples of 16, as in every real linear (Triton's launcher
    specializes such integers: what lets the compiler prove the plane and activation rows 16-byte aligned)."""
    sig = {"x_ptr": "*fp16" if float_act else "*i8", "sx_ptr": "*fp32", "xsum_ptr": "*i32", "base_ptr": "*u8",
           "refine_ptr": "*u8", "scale_ptr": "*fp16", "offset_ptr": "*fp16", "out_ptr": "*fp32", "view_ptr": "*i64",
           "M": "i32", "N": "i32", "K": "i32", "GROUPS_PER_SPLIT": "i32", "SPLITS": "i32"}
    const = {"TARGET": target, "HAS_OFFSET": offset, "FLOAT_ACT": float_act, "G": g,
             "DOT_K": gemm.dot_k(g), "BLOCK_N": 64, "BLOCK_M": gemm.block_m(m), "INTERP": False, "TILED": tiled,
             "RUNTIME_VIEW": runtime_view, "ONE_RUN": one_run}
    planes = 2 if target or runtime_view else 1
    return KernelSpec(name, gemm.gemm_kernel, sig | {k: "constexpr" for k in const}, const, gemm.GEMM_WARPS,
                      loop_weight_bytes=64 * planes * g // 2, prefill=True, held=held, divisible=("N", "K"),
                      loop_tokens=gemm.block_m(m), num_stages=gemm.GEMM_STAGES[one_run])


def _decode(name, target, m, g=128, runtime_view=False, held=True, tiled=True, residual=False):
    """The decode kernel for m tokens (what `gemv._launch_decode` launches): one group per loop iteration; `tiled`,
    on the warp-tiled planes the `triton` backend and the step graph's engine hold, else on canonical ones (a graph
    node whose linear does not tile, or a graph exported before the tiled layout); `residual`, adding the residual
    stream in the launch (o_proj and down_proj in the `triton` backend). N and K are multiples of 16, as Triton's
    launcher specializes them for every real linear."""
    sig = {"x_ptr": "*i32", "xsum_ptr": "*i32", "sx_ptr": "*fp32", "base_ptr": "*i32", "refine_ptr": "*i32",
           "scale_ptr": "*fp16", "offset_ptr": "*fp16", "out_ptr": "*fp32", "view_ptr": "*i64", "y_ptr": "*fp32",
           "count_ptr": "*i32", "res_ptr": "*fp32", "N": "i32", "K": "i32", "GROUPS_PER_SPLIT": "i32"}
    rows, block_s = gemv.decode_rows(m), 32 * gemv.DECODE_WARPS
    const = {"M": m, "TARGET": target, "HAS_OFFSET": False, "PARTIAL": True, "G": g, "ROWS": rows, "BLOCK_S": block_s,
             "INTERP": 0, "RUNTIME_VIEW": runtime_view, "TILED": tiled, "FUSED_REDUCE": gemv.FUSED_SPLIT_REDUCE,
             "HAS_RES": residual}
    return KernelSpec(name, gemv_decode.decode_gemv_kernel, sig | {k: "constexpr" for k in const}, const,
                      gemv.DECODE_WARPS, loop_weight_bytes=decode_loop_bytes(const), decode=True, held=held,
                      divisible=("N", "K"))


def decode_loop_bytes(const: dict) -> int:
    """Plane bytes a decode GEMV program reads a main-loop iteration (one group of its rows), from its constants:
    both planes for the target view and a run-time view (whose largest loop is its target view's)."""
    planes = 2 if const["TARGET"] or const["RUNTIME_VIEW"] else 1
    return const["ROWS"] * const["BLOCK_S"] * planes * const["G"] // 2


def held_to_budget(target: bool, m: int, g: int) -> bool:
    """Which decode variants BUDGETS binds: the target view at every M of a verification pass (1..DECODE_MAX_M)
    at groups of 64 and 128 (every real model's linears here: K divisible by 128, or by 64 for SmolLM2's 576), and
    at group 32 up to M = 5 (γ = 4; at 6-8 tokens a 16-byte group's float steps per token cost 4.3-4.7 a byte);
    the draft view at M = 1, the only M a draft step runs (prefill tails of a draft-only decode run 2-8 tokens:
    reported, not held; the draft's dp4a work per byte is twice the target's at the same M)."""
    return m <= 5 or g >= 64 if target else m == 1


def decode_sweep_specs() -> list[KernelSpec]:
    """The decode kernel at every M (1..DECODE_MAX_M), view and group size (32, 64, 128): `compile-kernels
    --decode-sweep`, each held to BUDGETS where `held_to_budget` says."""
    return [_decode(f"decode_{'target' if t else 'draft'}_m{m}_g{g}", t, m, g, held=held_to_budget(t, m, g))
            for t in (False, True) for g in (32, 64, 128) for m in range(1, gemv_decode.DECODE_MAX_M + 1)]


def _attention(name, d, r, arch=87, prefill=False):
    """The flash-decoding kernel for head dim d and GQA ratio r, as `attention._attend` launches it; with `prefill`,
    the prefill chunk's kernel (`attention_prefill`: a pass of more than SPLIT_QUERIES queries)."""
    ptrs = ["q_ptr", "base_ptr", "refine_ptr", "scale_ptr", "sbase_ptr", "srefine_ptr", "sscale_ptr"] + \
        (["out_ptr"] if prefill else ["m_ws", "l_ws", "acc_ws"]) + ["main_ptr", "seq_ptr", "kv8_ptr"]
    types = ["*fp32", "*i32", "*i32", "*fp16", "*i32", "*i32", "*fp16"] + ["*fp32"] * (1 if prefill else 3) + \
        ["*i32"] * 3
    ints = ("T", "cap", "scap", "s_h", "s_t") if prefill else ("T", "cap", "scap", "n_chunks")
    sig = dict(zip(ptrs, types)) | {k: "i32" for k in ints} | {"sm_scale": "fp32"}
    block_s = attention.block_s_for(d)
    const = {"HKV": 8, "R": r, "D": d, "BLOCK_S": block_s, "INTERP": False} | (
        {"BLOCK_M": attention_prefill.prefill_rows(d)} if prefill else {"CHUNK": attention.CHUNK,
                                                                        "BLOCK_M": attention.rows_per_tile(r)})
    if prefill:
        return KernelSpec(name, attention_prefill.flash_prefill_kernel, sig | {k: "constexpr" for k in const}, const,
                          attention_prefill.prefill_warps(d), num_stages=attention.STAGES,
                          maxnreg=attention_prefill.prefill_register_cap(arch), kv_step_bytes=block_s * d)
    return KernelSpec(name, attention.flash_decode_kernel, sig | {k: "constexpr" for k in const}, const,
                      attention.warps_for(d, r), num_stages=attention.STAGES, maxnreg=attention.register_cap(arch),
                      kv_step_bytes=block_s * d)


def _swiglu(name, n, factors, m=5, g=128):
    """The gated product with R4 and down_proj's quantization (`swiglu.swiglu_decode`) for an intermediate size n
    and the R4 layout its checkpoint records (plugins.hadamard.online_hadamard_factors)."""
    const = {"M": m, "G": g, "BLOCK_K": gemv_decode.tail_block(n, g), **swiglu.plan(n, factors, g)}
    del const["ROWS"]                                                   # a run-time argument
    ptrs = ("gate_ptr", "up_ptr", "h1_ptr", "h2_ptr", "out_ptr", "xq_ptr", "xsum_ptr", "sx_ptr", "count_ptr")
    sig = dict(zip(ptrs, ("*fp32",) * 5 + ("*i8", "*i32", "*fp32", "*i32"))) | \
        {"ROWS": "i32", "stride_g": "i32", "stride_u": "i32"} | {k: "constexpr" for k in const}
    return KernelSpec(name, swiglu.swiglu_decode_kernel, sig, const, swiglu.WARPS)


def _reduce(name, quant, d=128):
    """Flash decoding's chunk reduction (`attention._attend`), with `quant` also writing o_proj's decode activations
    (5 queries, group 128: Llama-2-7B's Hq*D of 4096)."""
    const = {"R": 4, "D": d, "CHUNK": attention.CHUNK, "NC": attention.REDUCE_CHUNKS, "QUANT": quant,
             "M": 5 if quant else 1, "G": 128 if quant else 1,
             "BLOCK_K": gemv_decode.tail_block(32 * d, 128) if quant else 1}
    sig = {"m_ws": "*fp32", "l_ws": "*fp32", "acc_ws": "*fp32", "out_ptr": "*fp32", "main_ptr": "*i64",
           "seq_ptr": "*i64", "kv8_ptr": "*i64", "T": "i32", "n_chunks": "i32", "cap": "i32", "scap": "i32",
           "s_h": "i32", "s_t": "i32", "xq_ptr": "*i8", "xsum_ptr": "*i32", "sx_ptr": "*fp32", "count_ptr": "*i32"}
    return KernelSpec(name, attention.chunk_reduce_kernel, sig | {k: "constexpr" for k in const}, const)


def _norm(name, h, decode=False):
    """The RMSNorm kernel (with `decode`, the one that also writes the next linears' activations: 5 tokens, group
    128) launched as `decoder_ops.norm_plan` launches rows of h."""
    plan = decoder_ops.norm_plan(h)
    const = {"BLOCK": plan["BLOCK"], "ONE": plan["ONE"]} | \
        ({"M": 5, "G": 128, "BLOCK_K": plan["BLOCK"]} if decode else {})
    sig = {"x_ptr": "*fp32", "w_ptr": "*fp16", "out_ptr": "*fp32"} | \
        ({"xq_ptr": "*i8", "xsum_ptr": "*i32", "sx_ptr": "*fp32"} if decode else {}) | \
        {"H": "i32", "stride_x": "i32", "eps": "fp32"} | {k: "constexpr" for k in const}
    fn = decoder_ops.rms_norm_decode_kernel if decode else decoder_ops.rms_norm_kernel
    return KernelSpec(name, fn, sig, const, plan["num_warps"])


def kernel_specs(arch: int = 87) -> list[KernelSpec]:
    """Every kernel at the decode shapes the runtime launches (group 128, 64 and 32; head dims 64 and 128), with the
    launch options the runtime passes on sm_`arch`."""
    return [
        KernelSpec("quantize_rows", gemm.quantize_rows_kernel,
                   {"x_ptr": "*fp32", "xq_ptr": "*i8", "sx_ptr": "*fp32", "xsum_ptr": "*i32", "K": "i32",
                    "stride_x": "i32", "G": "constexpr", "BLOCK_K": "constexpr"}, {"G": 128, "BLOCK_K": 1024}),
        KernelSpec("quantize_decode", gemv_decode.quantize_decode_kernel,
                   {"x_ptr": "*fp32", "xq_ptr": "*i8", "xsum_ptr": "*i32", "sx_ptr": "*fp32", "K": "i32",
                    "stride_x": "i32", "M": "constexpr", "G": "constexpr", "BLOCK_K": "constexpr"},
                   {"M": 5, "G": 128, "BLOCK_K": 1024}),
        _decode("decode_draft_m1", False, 1),                 # a draft step
        _decode("decode_target_m1", True, 1),                 # a target step
        _decode("decode_target_m5", True, 5),                 # verification at γ = 4
        _decode("decode_target_m8", True, 8),                 # the largest decode pass
        _decode("decode_target_m1_residual", True, 1, residual=True),   # o_proj / down_proj: the residual added
        _decode("decode_target_m8_residual", True, 8, residual=True),   # in the launch
        _decode("decode_runtime_view_m1", False, 1, runtime_view=True),       # the TensorRT plugin's form (the
        _decode("decode_runtime_view_m5", False, 5, runtime_view=True),       # engine's planes are warp-tiled)
        _decode("decode_runtime_view_canonical_m5", False, 5, runtime_view=True, tiled=False),   # a canonical node
        _decode("decode_draft_m1_g64", False, 1, g=64),       # the default model's group size
        _decode("decode_target_m5_g64", True, 5, g=64),
        _decode("decode_target_m8_g64", True, 8, g=64),
        _decode("decode_draft_m1_g32", False, 1, g=32),       # a 16-byte group: ptxas unrolls its loop 4 times
        _decode("decode_target_m5_g32", True, 5, g=32),
        _gemm("gemm_draft_m64", False),                       # prefill chunks (M > 8) on the tiled planes: 64
        _gemm("gemm_target_m64", True),                       # tokens a program, tensor cores
        _gemm("gemm_target_m64_g64", True, g=64),             # the default model's group size
        _gemm("gemm_target_m64_runs", True, one_run=False),   # K summed in the decode launch's runs (split > 1)
        _gemm("gemm_target_m16", True, m=16),                 # a verification pass of 9-16 tokens (γ >= 8)
        _gemm("gemm_target_m64_g32", True, g=32, held=False),      # a group of 16 bytes: half of each MMA's K
        _gemm("gemm_target_m64_offset", True, offset=True, held=False),   # a top-4-of-8 nest's offsets
        _gemm("gemm_runtime_view_m64", False, runtime_view=True),       # the TensorRT plugin's prefill
        _gemm("gemm_target_m64_canonical", True, tiled=False),          # canonical planes (a node that does not tile)
        _gemm("gemm_draft_w4a16_m16", False, float_act=True, tiled=False, m=16, held=False),   # float16
        _gemm("gemm_target_w8a16_m16", True, float_act=True, tiled=False, m=16, held=False),   # activations
        KernelSpec("gemv_split_reduce", gemv.split_reduce_kernel,
                   {"part_ptr": "*fp32", "sx_ptr": "*fp32", "out_ptr": "*fp32", "M": "i32", "N": "i32",
                    "SPLIT": "i32", "SCALE_X": "constexpr", "BLOCK": "constexpr"},
                   {"SCALE_X": True, "BLOCK": 256}),
        _attention("flash_decode_d128_mha", 128, 1, arch),     # Llama-2-7B
        _attention("flash_decode_d128_gqa4", 128, 4, arch),    # Llama-3-8B
        _attention("flash_decode_d64_gqa3", 64, 3, arch),      # SmolLM2-135M
        _attention("flash_prefill_d128_mha", 128, 1, arch, prefill=True),   # a prefill chunk: 64 queries a tile
        _attention("flash_prefill_d128_gqa4", 128, 4, arch, prefill=True),  # 16 queries x 4 heads
        _attention("flash_prefill_d64_gqa3", 64, 3, arch, prefill=True),    # 10 queries x 3 heads (32 rows)
        _reduce("flash_decode_reduce_d128", False),
        _reduce("flash_decode_reduce_d128_quantize", True),    # o_proj's activations written by the reduction
        _norm("rms_norm", 4096),                              # Llama-2-7B's rows: one block from registers
        _norm("rms_norm_decode", 4096, decode=True),          # the norm and the next linears' activations
        _norm("rms_norm_decode_loop", 16384, decode=True),    # rows past a block: the loops' form
        _swiglu("swiglu_r4_344x32", 11008, (344, 32)),       # Llama-2-7B's MLP: SiLU, R4, down's activations
        _swiglu("swiglu_r4_28x512", 14336, (28, 512)),       # Llama-3-8B's
        _swiglu("swiglu_r4_140x64", 8960, (140, 64)),        # Qwen2.5-1.5B's
        KernelSpec("rotate_decode_t", decoder_ops.rotate_decode_kernel,             # R1 undone before the final
                   {"x_ptr": "*fp32", "r_ptr": "*fp32", "out_ptr": "*fp32", "M": "i32", "H": "i32",   # norm, every
                    "TRANS": "constexpr", "MP": "constexpr", "BN": "constexpr", "BK": "constexpr"},    # token a read
                   {"TRANS": True, "MP": 8, "BN": decoder_ops.ROTATE_BN, "BK": decoder_ops.ROTATE_BK}),
        KernelSpec("rope_d128", decoder_ops.rope_kernel,
                   {"q_ptr": "*fp32", "k_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "qo_ptr": "*fp32",
                    "ko_ptr": "*fp32", "T": "i32", "HQ": "i32", "sq_h": "i32", "sq_t": "i32", "sk_h": "i32",
                    "sk_t": "i32", "D": "constexpr"}, {"D": 128}),
        KernelSpec("write_kv_d128", kv_write.write_kv_kernel,
                   {"k_ptr": "*fp32", "v_ptr": "*fp32", "base_ptr": "*u8", "refine_ptr": "*u8", "scale_ptr": "*fp16",
                    "end_ptr": "*i32", "T": "i32", "cap": "i32", "sk_h": "i32", "sk_t": "i32", "sv_h": "i32",
                    "sv_t": "i32", "HKV": "constexpr", "D": "constexpr"}, {"HKV": 8, "D": 128}),
        KernelSpec("rope_write_kv_d128", kv_write.rope_write_kv_kernel,             # RoPE and the KV write, one
                   {"q_ptr": "*fp32", "k_ptr": "*fp32", "v_ptr": "*fp32", "cos_ptr": "*fp32",   # launch (the
                    "sin_ptr": "*fp32", "qo_ptr": "*fp32", "base_ptr": "*u8", "refine_ptr": "*u8",   # static
                    "scale_ptr": "*fp16", "end_ptr": "*i32", "T": "i32", "cap": "i32", "HQ": "i32",   # passes')
                    "sq_h": "i32", "sq_t": "i32", "sk_h": "i32", "sk_t": "i32", "sv_h": "i32", "sv_t": "i32",
                    "HKV": "constexpr", "D": "constexpr"}, {"HKV": 8, "D": 128}),
    ]


def sass_proxy(sass: str, spec: KernelSpec) -> dict:
    """The bandwidth proxy of a GEMV (module docstring): its main loop's instructions and the lane instructions
    per weight byte they cost. ptxas may unroll a decode GEMV's loop (it does at group 32): the loop then covers
    as many groups as its dp4a count holds groups' worth (ROWS * M * G/4 a group), and their bytes."""
    if not spec.loop_weight_bytes:
        return {}
    loop = main_loop(sass)
    unroll = 1
    if spec.decode:
        c = spec.constexprs
        unroll = max(1, sum(bool(re.search(r"\bIDP\.4A\b", o)) for o in loop) // (c["ROWS"] * c["M"] * c["G"] // 4))
    per_byte = len(loop) * 32 * spec.num_warps / (unroll * spec.loop_weight_bytes)
    out = {"loop_instructions": len(loop), "loop_weight_bytes": unroll * spec.loop_weight_bytes,
           "loop_unroll": unroll, "loop_ldg128": sum(bool(re.search(r"\bLDG\.E\S*\.128\b", o)) for o in loop),
           "instructions_per_weight_byte": round(per_byte, 3)}
    if spec.prefill:          # a GEMM's weight byte serves its BLOCK_M tokens: what a token of a chunk costs
        out |= {"loop_tokens": spec.loop_tokens, "loop_imma": sum(bool(re.search(IMMA, o)) for o in loop),
                "loop_hmma": sum(bool(re.search(HMMA, o)) for o in loop),
                "instructions_per_weight_byte_token": round(per_byte / spec.loop_tokens, 4)}
    return out


def attention_proxy(sass: str, spec: KernelSpec) -> dict:
    """The attention proxy (module docstring): the position loops in code order (`ATTENTION_LOOPS`: KV4's whole
    steps, its edge steps, then KV8's), each with its instructions, plane loads and lane instructions per KV byte."""
    if not spec.kv_step_bytes:
        return {}
    loops = load_loops(sass)
    if len(loops) != len(ATTENTION_LOOPS):
        return {"attention_loops": len(loops)}
    out = {"attention_loops": len(loops), "tile_rows": spec.constexprs["BLOCK_M"],
           "prefill_tile": spec.fn is attention_prefill.flash_prefill_kernel}
    for (view, kind, planes), loop in zip(ATTENTION_LOOPS, loops):
        out |= {f"{view}{kind}_loop_instructions": len(loop), f"{view}{kind}_loop_plane_loads": _plane_loads(loop),
                f"{view}{kind}_loop_ldg128": sum(bool(re.search(r"\bLDG\.E\S*\.128\b", o)) for o in loop),
                f"instructions_per_{view}_byte{kind}": round(len(loop) * 32 * spec.num_warps /
                                                             (planes * spec.kv_step_bytes), 3)}
    return out


def attention_budget_failures(row: dict) -> list[str]:
    """What a compiled flash-decoding kernel misses of ATTENTION_BUDGETS (a prefill tile's, of
    PREFILL_ATTENTION_BUDGETS: per KV byte and row); [] where it meets them. Each KV4 loop must also issue half the
    plane loads of its KV8 loop (no refinement load where the view is KV4)."""
    out, prefill = [], row.get("prefill_tile")
    budgets, rows = (PREFILL_ATTENTION_BUDGETS, row["tile_rows"]) if prefill else (ATTENTION_BUDGETS, 1)
    cc = int(re.search(r"\d+", row["target"]).group())
    cap = attention_prefill.prefill_register_cap(cc) if prefill else attention.register_cap(cc)   # the launch's cap
    if row["registers"] is None or row["registers"] > cap:
        out.append(f"{row['registers']} registers > {cap}")
    if row["spill_store_bytes"] + row["spill_load_bytes"] > ATTENTION_BUDGETS["spill_bytes"]:
        out.append(f"spills {row['spill_store_bytes']} + {row['spill_load_bytes']} bytes")
    if prefill and rows < budgets["tile_rows"]:
        out.append(f"a tile of {rows} rows < {budgets['tile_rows']}: the KV read once per fewer queries")
    if row.get("attention_loops") != len(ATTENTION_LOOPS):
        return out + [f"{row.get('attention_loops')} position loops with loads, not a KV4 and a KV8 loop of whole "
                      "steps and one each of edge steps"]
    for view, kind, _ in ATTENTION_LOOPS:
        key = f"instructions_per_{view}_byte{kind}"
        if row[key] / rows > budgets[key]:
            out.append(f"{row[key] / rows:.3g} lane instructions per {view.upper()} byte{kind.replace('_', ' ')}"
                       f"{' and row' if prefill else ''} > {budgets[key]}")
    for view in ("kv4", "kv8"):
        whole, edge = row[f"{view}_loop_instructions"], row[f"{view}_edge_loop_instructions"]
        if whole >= edge:
            out.append(f"the {view.upper()} loop of whole steps holds {whole} instructions, its edge loop {edge}: "
                       "not fewer (the whole steps' clamp, plane choice or mask put back?)")
    for kind in ("", "_edge"):
        kv4, kv8 = row[f"kv4{kind}_loop_plane_loads"], row[f"kv8{kind}_loop_plane_loads"]
        if 2 * kv4 != kv8:
            out.append(f"the KV4{kind.replace('_', ' ')} loop issues {kv4} plane loads, the KV8 one {kv8}: not half "
                       "(a refinement load where the view is KV4?)")
    return out


def _resource_failures(row: dict, budgets: dict, per: str = "") -> list[str]:
    """What `row` misses of `budgets`' registers, spills and lane instructions per weight byte (`per`: what a byte
    serves, in words), each in a few words."""
    out = []
    if row["registers"] is None or row["registers"] > budgets["registers"]:
        out.append(f"{row['registers']} registers > {budgets['registers']}")
    if row["spill_store_bytes"] + row["spill_load_bytes"] > budgets["spill_bytes"]:
        out.append(f"spills {row['spill_store_bytes']} + {row['spill_load_bytes']} bytes")
    per_byte = row.get("instructions_per_weight_byte")
    if per_byte is None or per_byte > budgets["instructions_per_weight_byte"]:
        out.append(f"{per_byte} lane instructions per weight byte{per} > {budgets['instructions_per_weight_byte']}")
    return out


def prefill_budget_failures(row: dict) -> list[str]:
    """What a compiled prefill GEMM (64 tokens a program) misses of PREFILL_BUDGETS; [] where it meets them. Its main
    loop must run on the tensor cores (IMMA; HMMA for float16 activations)."""
    out = _resource_failures(row, PREFILL_BUDGETS, f" of {row.get('loop_tokens')} tokens")
    if not row.get("loop_imma") and not row.get("loop_hmma"):
        out.append("no matrix instruction (IMMA, HMMA) in the main loop")
    return out


def budget_failures(row: dict) -> list[str]:
    """What a compiled decode GEMV (a `compile_all` row) misses of BUDGETS, each in a few words; [] where it meets
    them. It must also dot on CUDA cores (dp4a, no matrix instructions) and load its planes 128 bits at a time."""
    out = _resource_failures(row, BUDGETS)
    if row["imma"] or row["hmma"] or not row["idp4a"]:
        out.append(f"matrix instructions (IMMA {row['imma']}, HMMA {row['hmma']}) or no dp4a ({row['idp4a']})")
    if not row.get("loop_ldg128"):
        out.append("no 128-bit load in the main loop")
    return out


def compile_spec(spec: KernelSpec, out_dir: Path, arch: int = 87, ptx_version: int = JETPACK6_PTX) -> dict:
    """Compile one spec for sm_`arch`, write NAME.ptx and NAME.cubin under out_dir and summarize it (a decode
    GEMV's row also lists what it misses of BUDGETS)."""
    options = {"num_warps": spec.num_warps, "num_stages": spec.num_stages, "ptx_version": ptx_version,
               "enable_fp_fusion": False}
    if spec.maxnreg:
        options["maxnreg"] = spec.maxnreg
    sig, const = spec.signature, spec.constexprs
    if "PDL" in spec.fn.arg_names and "PDL" not in const:     # as `common.pdl` launches it on sm_`arch`
        sig, const = sig | {"PDL": "constexpr"}, const | {"PDL": arch >= PDL_MIN_CC}
        if const["PDL"]:
            options["launch_pdl"] = True
        if "PREFETCH" in spec.fn.arg_names and "PREFETCH" not in const:    # the weights' prefetch before the wait
            sig, const = sig | {"PREFETCH": "constexpr"}, const | {"PREFETCH": const["PDL"]}
    k = triton.compile(ASTSource(spec.fn, sig, const, spec.attrs()), target=GPUTarget("cuda", arch, 32),
                       options=options)
    return summarize(k, spec, out_dir, arch)


def summarize(k, spec: KernelSpec, out_dir: Path, arch: int) -> dict:
    """`compile_spec`'s summary of k, the spec compiled (Triton's CompiledKernel), its PTX and cubin written."""
    ptx, cubin = out_dir / f"{spec.name}.ptx", out_dir / f"{spec.name}.cubin"
    ptx.write_text(k.asm["ptx"])
    cubin.write_bytes(k.asm["cubin"])
    sass = _sass(cubin)
    isa = re.search(r"^\.version (\d+\.\d+)", k.asm["ptx"], re.M)
    row = {"kernel": spec.name, "ptx_isa": isa.group(1) if isa else None,
           "target": re.search(r"^\.target (\S+)", k.asm["ptx"], re.M).group(1),
           "shared_bytes": k.metadata.shared, "num_warps": spec.num_warps,
           "ptx_int8_mma": len(re.findall(r"mma\.sync\.aligned\.\S*\.s8\.s8", k.asm["ptx"])),
           "ptx_dp4a": k.asm["ptx"].count("dp4a"), "dependent_launch": dependent_launch_order(sass),
           **ptxas_usage(ptx, arch), **sass_instructions(sass),
           **sass_proxy(sass, spec), **attention_proxy(sass, spec)}
    if spec.decode:
        row["budget_failures"] = budget_failures(row)
    elif spec.prefill:
        row["budget_failures"] = prefill_budget_failures(row)
    elif spec.kv_step_bytes:
        row["budget_failures"] = attention_budget_failures(row)
    if "budget_failures" in row:
        row["held"] = spec.held
    return row


def compile_all(out_dir: Path, arch: int = 87, ptx_version: int = JETPACK6_PTX, sweep: bool = False) -> list[dict]:
    """Compile every kernel spec for sm_`arch` (`compile_spec`), or with `sweep` every decode variant
    (`decode_sweep_specs`); returns their summaries."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [compile_spec(spec, out_dir, arch, ptx_version)
            for spec in (decode_sweep_specs() if sweep else kernel_specs(arch))]
