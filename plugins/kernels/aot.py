"""Ahead-of-time compilation of every kernel for a GPU architecture without a GPU (`triton.compile` with an explicit
target), and the resource summary of each: registers and spills (from the bundled ptxas), shared memory (Triton's
metadata), and which matrix instructions the SASS holds (int8 IMMA, float16 HMMA, dp4a).

Argument types are the ones the launchers pass at run time (activations, queries and new K/V are float32; the
float16-activation GEMV variants take float16), so the registers reported are those of the kernels that run.

PTX ISA version: Triton 3.9 bundles ptxas 12.9 and by default emits PTX ISA 8.8, which the CUDA 12.6 driver of
JetPack 6.1/6.2 cannot JIT (12.6 reads PTX up to ISA 8.5). We pin `ptx_version=85` for sm_87, so the PTX loads on
JetPack 6's driver; the cubins are sm_87 SASS. On the device Triton compiles at run time with the ptxas that
TRITON_PTXAS_PATH names (plugins.kernels.common points it at JetPack's /usr/local/cuda/bin/ptxas when present, so the
PTX version follows the installed CUDA).
"""

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from plugins.kernels import attention, gemv

JETPACK6_PTX = 85     # PTX ISA 8.5: the newest the CUDA 12.6 driver (JetPack 6.1/6.2) loads


@dataclass(frozen=True)
class KernelSpec:
    """One compiled variant: a kernel, its argument types and the compile-time constants of a decode shape."""

    name: str
    fn: object
    signature: dict
    constexprs: dict
    num_warps: int = 4


def _gemv(name, target, float_act, split, g=128, runtime_view=False):
    sig = {"x_ptr": "*fp16" if float_act else "*i8", "sx_ptr": "*fp32", "base_ptr": "*u8", "refine_ptr": "*u8",
           "scale_ptr": "*fp16", "offset_ptr": "*fp16", "out_ptr": "*fp32", "view_ptr": "*i64", "M": "i32",
           "N": "i32", "K": "i32", "GROUPS_PER_SPLIT": "i32"}
    const = {"TARGET": target, "HAS_OFFSET": False, "FLOAT_ACT": float_act, "SPLIT": split, "G": g,
             "DOT_K": gemv.dot_k(g), "BLOCK_N": 64, "BLOCK_M": gemv.BLOCK_M, "INTERP": False,
             "RUNTIME_VIEW": runtime_view}
    return KernelSpec(name, gemv.dual_plane_kernel, sig | {k: "constexpr" for k in const}, const)


def _attention(name, d, r, num_warps=4):
    ptrs = ["q_ptr", "base_ptr", "refine_ptr", "scale_ptr", "sbase_ptr", "srefine_ptr", "sscale_ptr",
            "m_ws", "l_ws", "acc_ws", "main_ptr", "seq_ptr", "kv8_ptr"]
    types = ["*fp32", "*u8", "*u8", "*fp16", "*u8", "*u8", "*fp16", "*fp32", "*fp32", "*fp32", "*i32", "*i32", "*i32"]
    sig = dict(zip(ptrs, types)) | {k: "i32" for k in ("T", "cap", "scap", "n_chunks")} | {"sm_scale": "fp32"}
    const = {"HKV": 8, "R": r, "D": d, "CHUNK": attention.CHUNK, "BLOCK_S": attention.BLOCK_S, "BLOCK_M": attention.rows_per_tile(r),
             "INTERP": False}
    return KernelSpec(name, attention.flash_decode_kernel, sig | {k: "constexpr" for k in const}, const, num_warps)


def kernel_specs() -> list[KernelSpec]:
    """Every kernel at the decode shapes the runtime launches (group 128, 64 and 32; head dims 64 and 128)."""
    return [
        KernelSpec("quantize_rows", gemv.quantize_rows_kernel,
                   {"x_ptr": "*fp32", "xq_ptr": "*i8", "sx_ptr": "*fp32", "K": "i32", "stride_x": "i32",
                    "BLOCK_K": "constexpr"}, {"BLOCK_K": 1024}),
        _gemv("gemv_draft_w4a8", False, False, 4),
        _gemv("gemv_target_w8a8", True, False, 4),
        _gemv("gemv_target_w8a8_g64_nosplit", True, False, 1, g=64),
        _gemv("gemv_target_w8a8_g32", True, False, 4, g=32),     # a group of 16 bytes: below int8 MMA's K of 32
        _gemv("gemv_runtime_view_w8a8", False, False, 4, runtime_view=True),    # the TensorRT plugin's form
        _gemv("gemv_draft_w4a16", False, True, 4),
        _gemv("gemv_target_w8a16", True, True, 4),
        KernelSpec("gemv_split_reduce", gemv.split_reduce_kernel,
                   {"part_ptr": "*fp32", "sx_ptr": "*fp32", "out_ptr": "*fp32", "M": "i32", "N": "i32",
                    "SPLIT": "constexpr", "SCALE_X": "constexpr", "BLOCK": "constexpr"},
                   {"SPLIT": 4, "SCALE_X": True, "BLOCK": 256}),
        _attention("flash_decode_d128_mha", 128, 1, attention.warps_for(128, 1)),
        _attention("flash_decode_d128_gqa4", 128, 4, attention.warps_for(128, 4)),
        _attention("flash_decode_d64_gqa3", 64, 3, attention.warps_for(64, 3)),
        KernelSpec("flash_decode_reduce_d128", attention.chunk_reduce_kernel,
                   {"m_ws": "*fp32", "l_ws": "*fp32", "acc_ws": "*fp32", "out_ptr": "*fp32", "T": "i32",
                    "n_chunks": "i32", "R": "constexpr", "D": "constexpr"}, {"R": 4, "D": 128}),
        KernelSpec("write_kv_d128", attention.write_kv_kernel,
                   {"x_ptr": "*fp32", "base_ptr": "*u8", "refine_ptr": "*u8", "scale_ptr": "*fp16", "end_ptr": "*i32",
                    "T": "i32", "cap": "i32", "HKV": "constexpr", "D": "constexpr"}, {"HKV": 8, "D": 128}),
    ]


def _tool(name: str) -> str:
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def ptxas_usage(ptx_file: Path, arch: int) -> dict:
    """Registers and spill bytes as the bundled ptxas reports them for `ptx_file`."""
    out = subprocess.run([_tool("ptxas"), "-v", f"--gpu-name=sm_{arch}", str(ptx_file), "-o", "/dev/null"],
                         capture_output=True, text=True, check=True).stderr
    regs = re.search(r"Used (\d+) registers", out)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
    return {"registers": int(regs.group(1)) if regs else None,
            "spill_store_bytes": int(spill.group(1)) if spill else 0,
            "spill_load_bytes": int(spill.group(2)) if spill else 0}


def sass_instructions(cubin_file: Path) -> dict:
    """Counts of the matrix / dot-product instructions in the SASS of `cubin_file`."""
    sass = subprocess.run([_tool("cuobjdump"), "-sass", str(cubin_file)], capture_output=True, text=True,
                          check=True).stdout
    return {"imma": len(re.findall(r"\bIMMA\b", sass)), "hmma": len(re.findall(r"\bHMMA\b", sass)),
            "idp4a": len(re.findall(r"\bIDP\.4A\b", sass)), "sass_lines": sass.count("\n")}


def compile_all(out_dir: Path, arch: int = 87, ptx_version: int = JETPACK6_PTX) -> list[dict]:
    """Compile every kernel spec for sm_`arch`; writes NAME.ptx and NAME.cubin under out_dir, returns summaries."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = GPUTarget("cuda", arch, 32)
    rows = []
    for spec in kernel_specs():
        src = ASTSource(spec.fn, spec.signature, spec.constexprs)
        k = triton.compile(src, target=target, options={"num_warps": spec.num_warps, "ptx_version": ptx_version,
                                                         "enable_fp_fusion": False})
        ptx, cubin = out_dir / f"{spec.name}.ptx", out_dir / f"{spec.name}.cubin"
        ptx.write_text(k.asm["ptx"])
        cubin.write_bytes(k.asm["cubin"])
        isa = re.search(r"^\.version (\d+\.\d+)", k.asm["ptx"], re.M)
        rows.append({"kernel": spec.name, "ptx_isa": isa.group(1) if isa else None,
                     "target": re.search(r"^\.target (\S+)", k.asm["ptx"], re.M).group(1),
                     "shared_bytes": k.metadata.shared, "num_warps": spec.num_warps,
                     "ptx_int8_mma": len(re.findall(r"mma\.sync\.aligned\.\S*\.s8\.s8", k.asm["ptx"])),
                     "ptx_dp4a": k.asm["ptx"].count("dp4a"),
                     **ptxas_usage(ptx, arch), **sass_instructions(cubin)})
    return rows
