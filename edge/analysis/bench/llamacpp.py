"""llama.cpp built for the CPU it runs on: the peer a user of this machine would really run, beside the `xllamacpp`
wheel (built for AVX2 only: its system_info says AVX512 = 0 on an AVX-512 VNNI machine, where this runtime's step uses
VNNI). Built once per machine into the cache folder from the llama.cpp sources vendored in the `llama-cpp-python`
source distribution on the package index (SDIST; llama.cpp commit LLAMA_COMMIT), with `cmake -DGGML_NATIVE=ON` and
ninja, about 10 minutes on 2 cores; `llama-bench` then runs in its own process, prompt processing (pp) and token
generation (tg) as separate tests, with its own medians over `-r` repetitions. Where cmake, ninja or a C++ compiler is
missing the peer is skipped with one line that names what to install."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from edge.errors import BitNestError

SDIST = ("llama-cpp-python", "0.3.36")
LLAMA_COMMIT = "0c1e570"
TARGETS = ("llama-bench", "llama-quantize")
TOOLS = {"cmake": "cmake", "ninja": "ninja", "c++": "a C++ compiler (g++ or clang++)"}
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DBUILD_SHARED_LIBS=OFF",
               "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF")


def missing_tools(which=None) -> list[str]:
    """What the build needs and this machine lacks (cmake, ninja, a C++ compiler), as words to print."""
    which = which or shutil.which
    missing = [TOOLS[t] for t in ("cmake", "ninja") if which(t) is None]
    if not any(which(c) for c in (os.environ.get("CXX") or "", "c++", "g++", "clang++") if c):
        missing.append(TOOLS["c++"])
    return missing


def machine_key() -> str:
    """What a GGML_NATIVE build depends on: the CPU model and its flags (a build for one CPU may not run on another)
    and the sources' version."""
    from edge.analysis.bench.machine import _cpuinfo
    info = _cpuinfo()
    key = json.dumps([SDIST, LLAMA_COMMIT, CMAKE_FLAGS, info.get("model name", ""), info.get("flags", "")])
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def build_folder(cache: Path) -> Path:
    return cache / "llamacpp-native" / f"{SDIST[1]}-{LLAMA_COMMIT}-{machine_key()}"


def binary(cache: Path, name: str = "llama-bench") -> Path | None:
    """The built tool, or None where this machine has no finished build."""
    path = build_folder(cache) / "bin" / name
    return path if path.is_file() else None


def skip_reason(cache: Path) -> str | None:
    """Why the native peer cannot run here (one line), or None: a finished build, or the tools to make one."""
    if binary(cache):
        return None
    missing = missing_tools()
    if missing:
        return (f"native llama.cpp peer skipped: {', '.join(missing)} not found (install them, e.g. "
                "`apt-get install cmake ninja-build g++`, or use --peer llamacpp for the wheel only)")
    return None


def _sdist(cache: Path, log) -> Path:
    """The source distribution, fetched once by pip (the package index, as any install) into the cache."""
    folder = cache / "sdist"
    found = sorted(folder.glob(f"{SDIST[0].replace('-', '_')}-{SDIST[1]}.tar.gz"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    log(f"fetching the {SDIST[0]} {SDIST[1]} source distribution (llama.cpp {LLAMA_COMMIT}) with pip")
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(folder),
                        f"{SDIST[0]}=={SDIST[1]}"], capture_output=True, text=True)
    found = sorted(folder.glob(f"{SDIST[0].replace('-', '_')}-{SDIST[1]}.tar.gz"))
    if r.returncode or not found:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        raise BitNestError(f"could not fetch the {SDIST[0]} {SDIST[1]} sources with pip ({tail[0]}): the native "
                           "llama.cpp peer needs them once (or use --peer llamacpp for the wheel only)")
    return found[0]


def _extract(sdist: Path, dest: Path) -> Path:
    """The vendored llama.cpp tree of the sdist, extracted under `dest`; its root."""
    prefix = f"{sdist.name[:-len('.tar.gz')]}/vendor/llama.cpp/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise BitNestError(f"{sdist.name} holds no vendor/llama.cpp: not the expected source distribution")
        tar.extractall(dest, members=members, filter="data")
    return dest / prefix


def ensure_built(cache: Path, log=print) -> Path:
    """The native `llama-bench`, built first where this machine has none (atomic: the build folder appears whole,
    renamed from a temporary one, so a killed build leaves nothing that looks finished)."""
    found = binary(cache)
    if found:
        return found
    missing = missing_tools()
    if missing:
        raise BitNestError(skip_reason(cache))
    final = build_folder(cache)
    work = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    try:
        src = _extract(_sdist(cache, log), work / "src")
        build = work / "build"
        log(f"building llama.cpp {LLAMA_COMMIT} for this CPU (GGML_NATIVE) into {final}: ~10 min on 2 cores")
        for cmd in (["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", *CMAKE_FLAGS],
                    ["ninja", "-C", str(build), *TARGETS]):
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode:
                (work / "build.log").write_text(r.stdout + r.stderr)
                tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
                raise BitNestError(f"building llama.cpp failed at `{cmd[0]}` ({tail[0][:200]}); the log is in {work}")
        (work / "bin").mkdir()
        for t in TARGETS:
            shutil.copy2(build / "bin" / t, work / "bin" / t)
        shutil.rmtree(work / "src"), shutil.rmtree(build)
        os.replace(work, final)
    except BaseException:
        if not (work / "build.log").exists():
            shutil.rmtree(work, ignore_errors=True)
        raise
    return final / "bin" / TARGETS[0]


def quantized(cache: Path, source: Path, kind: str) -> Path:
    """`source` re-quantized to `kind` (e.g. Q4_K_M) by the native `llama-quantize` (--allow-requantize: the source
    is itself quantized), written once beside it (atomic rename)."""
    out = source.with_name(source.name.replace("-Q8_0-", f"-{kind}-").replace(".Q8_0.", f".{kind}."))
    if out == source:
        out = source.with_name(f"{source.stem}.{kind}.gguf")
    if out.is_file():
        return out
    tool = binary(cache, "llama-quantize")
    if tool is None:
        raise BitNestError("no native llama-quantize here: the native llama.cpp build makes it (ensure_built)")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        r = subprocess.run([str(tool), "--allow-requantize", str(source), str(tmp), kind], capture_output=True,
                           text=True)
        if r.returncode:
            tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
            raise BitNestError(f"llama-quantize {source.name} to {kind} failed ({tail[0][:200]})")
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    return out


def llama_bench(tool: Path, gguf: Path, threads: int, prompt: int = 0, gen: int = 0, repeats: int = 1,
                depth: int = 0) -> list[dict]:
    """`llama-bench` on `gguf` in its own process: a pp test of `prompt` tokens and/or a tg test of `gen` tokens after
    `depth` cached tokens, each repeated `repeats` times (its JSON records, one per test)."""
    if not (prompt or gen):
        raise ValueError("llama-bench needs a prompt or a generation length")
    cmd = [str(tool), "-m", str(gguf), "-t", str(threads), "-p", str(prompt), "-n", str(gen), "-r", str(repeats),
           "-d", str(depth), "-o", "json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        tail = r.stderr.strip().splitlines()[-1:] or ["no output"]
        raise BitNestError(f"llama-bench failed on {gguf.name} ({tail[0][:200]})")
    return [t for t in json.loads(r.stdout) if t.get("n_prompt") or t.get("n_gen")]


def test_rate(records: list[dict], kind: str) -> dict:
    """The pp or tg record's tok/s (llama-bench's mean and samples) and what it ran."""
    for t in records:
        if (kind == "pp" and t["n_prompt"] and not t["n_gen"]) or (kind == "tg" and t["n_gen"] and not t["n_prompt"]):
            return {"tok_s": round(t["avg_ts"], 2), "samples_ts": [round(x, 2) for x in t.get("samples_ts", [])],
                    "tokens": t["n_prompt"] or t["n_gen"], "depth": t.get("n_depth", 0)}
    raise BitNestError(f"llama-bench printed no {kind} test")


def system_info(records: list[dict]) -> dict:
    """What llama-bench says about its run (CPU, backends, threads, model type, batch sizes, KV types, repacking) and
    how it was built (llama-bench prints no commit from an sdist, which has no git history, and no ISA list: a
    GGML_NATIVE build compiles for every instruction set this CPU has, which the bench's machine record lists)."""
    first = records[0] if records else {}
    keys = ("cpu_info", "backends", "n_threads", "model_type", "model_size", "model_n_params", "type_k", "type_v",
            "n_batch", "n_ubatch", "flash_attn", "repack", "load_mode")
    return {**{k: first.get(k) for k in keys},
            "build": {"sdist": "==".join(SDIST), "llama_cpp_commit": LLAMA_COMMIT, "cmake": list(CMAKE_FLAGS)}}
