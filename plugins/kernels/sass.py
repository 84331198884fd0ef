"""Reading a compiled kernel: the registers and spills the bundled ptxas reports for its PTX, and its SASS
(cuobjdump): the matrix, dp4a and 128-bit load instructions it holds, and its loops that stream global memory (the
spans between a backward branch's target and the branch), which `aot`'s bandwidth proxies measure."""

import re
import subprocess
from pathlib import Path

import triton

IMMA = r"\bIG?MMA\b"   # int8 tensor-core instructions in SASS: IMMA, or from sm_90 on the warpgroup IGMMA (wgmma)
HMMA = r"\bHG?MMA\b"   # float16 ones: HMMA, or HGMMA
PREFETCH = r"\bCCTL\S*\.PF[12]\b"   # prefetch.global.L1 / .L2: asks the cache for a line, loads no value


def _tool(name: str) -> str:
    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def ptxas_usage(ptx_file: Path, arch: int) -> dict:
    """Registers and spill bytes as the bundled ptxas reports them for `ptx_file`, compiled for the target its PTX
    names (sm_90a where Triton targets Hopper's arch-specific features; else sm_`arch`); ValueError with ptxas's own
    line where it refuses."""
    target = re.search(r"^\.target (sm_\w+)", ptx_file.read_text(), re.M)
    run = subprocess.run([_tool("ptxas"), "-v", f"--gpu-name={target.group(1) if target else f'sm_{arch}'}",
                          str(ptx_file), "-o", "/dev/null"], capture_output=True, text=True)
    out = run.stderr
    if run.returncode:
        fatal = [ln for ln in out.splitlines() if "fatal" in ln or "error" in ln] or ["no message"]
        raise ValueError(f"ptxas refused {ptx_file.name} for sm_{arch}: {fatal[0].strip()[:200]}")
    regs = re.search(r"Used (\d+) registers", out)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", out)
    return {"registers": int(regs.group(1)) if regs else None,
            "spill_store_bytes": int(spill.group(1)) if spill else 0,
            "spill_load_bytes": int(spill.group(2)) if spill else 0}


def _sass(cubin_file: Path) -> str:
    return subprocess.run([_tool("cuobjdump"), "-sass", str(cubin_file)], capture_output=True, text=True,
                          check=True).stdout


def sass_instructions(sass: str) -> dict:
    """Counts of the matrix / dot-product instructions, of 128-bit global loads and of cache prefetches (CCTL .PF1 /
    .PF2) in `sass` (cuobjdump -sass)."""
    return {"imma": len(re.findall(IMMA, sass)), "hmma": len(re.findall(HMMA, sass)),
            "idp4a": len(re.findall(r"\bIDP\.4A\b", sass)), "ldg128": len(re.findall(r"\bLDG\.E\S*\.128\b", sass)),
            "prefetches": len(re.findall(PREFETCH, sass)), "sass_lines": sass.count("\n")}


def _code(sass: str) -> list[tuple[int, str]]:
    """(address, instruction) of each instruction of `sass`, in code order (cuobjdump prints each as
    /*ADDR*/ OPCODE ...;)."""
    return [(int(a, 16), op.strip()) for a, op in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]


def _unpredicated(op: str) -> str:
    """An instruction without its guard predicate (`@P0 BRA 0x120` -> `BRA 0x120`)."""
    return op.split(None, 1)[1] if op.startswith("@") and " " in op else op


def _spans(sass: str) -> list[tuple[int, int, list[str]]]:
    """(first address, last address, instructions) of each loop of `sass` holding a global load, in code order: from
    a backward branch's target to the branch (cuobjdump prints each instruction as /*ADDR*/ OPCODE ...;)."""
    code = _code(sass)
    loops = []
    for addr, op in code:
        jump = re.search(r"\bBRA\b.*?0x([0-9a-f]+)", op)
        if jump and int(jump.group(1), 16) <= addr:
            start = int(jump.group(1), 16)
            body = [o for a, o in code if start <= a <= addr]
            if any(re.search(r"\bLDG\b", o) for o in body):
                loops.append((start, addr, body))
    return sorted(loops, key=lambda t: t[0])


def load_loops(sass: str) -> list[list[str]]:
    """The instructions of each loop of `sass` holding a global load, in code order (`_spans`)."""
    return [body for _, _, body in _spans(sass)]


def main_loop(sass: str) -> list[str]:
    """The largest innermost loop of `sass` holding a global load (`_spans`) and a dot instruction (dp4a, IMMA, HMMA:
    a GEMV's weight stream, not its split reduction's loop over partials, nor an outer loop around the stream, as
    the GEMM's runs of a split of K), or the largest loop holding a global load where no loop has a dot; empty
    where there is none."""
    spans = _spans(sass)
    dots = [t for t in spans if any(re.search(rf"\bIDP\.4A\b|{IMMA}|{HMMA}", o) for o in t[2])]
    inner = [t for t in dots if not any(o is not t and t[0] <= o[0] and o[1] <= t[1] for o in dots)]
    return max([t[2] for t in inner] or [t[2] for t in spans], key=len, default=[])


def _plane_loads(loop: list[str]) -> int:
    """Global loads of 32 bits or more in `loop` (plane words; the float16 scales are 16-bit loads)."""
    ops = [_unpredicated(o).split()[0] for o in loop]
    return sum(op.startswith("LDG") and not re.search(r"\.[US](8|16)\b", op) for op in ops)


GLOBAL_MEMORY = re.compile(r"^(LDG|STG|LD|ST|ATOMG?|ATOM|RED|REDG|LDGSTS|UTMALDG|UTMASTG|UBLKCP|UBLKRED|CCTL)\b")
BRANCH = re.compile(r"^(BRA|BRX|JMP|JMX|CALL|RET)\b")


def dependent_launch_order(sass: str) -> str:
    """Where `sass` waits on the launch before it (programmatic dependent launch: griddepcontrol.wait is ACQBULK in
    SASS): "wait first" where the wait comes before every global memory instruction and every branch (so it is in
    the entry's straight-line code: every path to global memory passes it), "prefetch, then wait" where only cache
    prefetches (CCTL .PF1 / .PF2, which load no value) come before it and no branch, "late" where a global memory
    access or a branch precedes it, "none" where the kernel never waits."""
    ops = [_unpredicated(op) for _, op in _code(sass)]
    wait = next((i for i, op in enumerate(ops) if op.startswith("ACQBULK")), None)
    if wait is None:
        return "none"
    early = [op for op in ops[:wait] if GLOBAL_MEMORY.match(op) or BRANCH.match(op)]
    if not early:
        return "wait first"
    return "prefetch, then wait" if all(re.match(PREFETCH, op) for op in early) else "late"
