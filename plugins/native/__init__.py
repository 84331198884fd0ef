"""Native CPU plugins: the C++ ops of the op contracts (plugins/contracts.py) registered through torch.library as
`bitnest::<op>`, and the whole decoder step as `torch.classes.bitnest.DecoderStep`, built from the repo's sources on
this machine the first time they are needed (or by scripts/setup.sh) and cached; the launchers below check shapes
and call them, with the same arguments as plugins.reference.

Kernels, chosen at run time by what the CPU and its OS support (CPUID and XCR0): AVX-512 VNNI, AVX-VNNI or AVX2 +
FMA + F16C on x86-64, NEON with `sdot` (or widening multiplies) on aarch64, portable C++ anywhere; every set gives
the same nested-linear rows bit for bit. They run on the step's own threads (pool.h). `BITNEST_NATIVE_ISA` forces
one (ISA_NAMES). Build: gcc/g++ from the distribution and ninja from the package index; `BITNEST_CACHE` (default
~/.cache/bitnest-edge) holds the built library. Processes that load it at once build it once: the whole build and
load runs under an exclusive lock on `build.lock` in the build folder (fcntl.flock, released by the OS if its holder
dies), and each build that produced a new library appends a line to `builds.log` there.
"""

import os
import platform
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import torch

from plugins.contracts import DUAL_PLANE_LINEAR, NESTED_KV_ATTENTION, check_view

KERNEL_SOURCES = ("cpu_features.cpp", "layout.cpp", "kernels_generic.cpp", "avx2_tokens.cpp", "kernels_avx2.cpp",
                  "kernels_avx_vnni.cpp", "kernels_avx512.cpp", "kernels_neon.cpp", "step.cpp")
SOURCES = KERNEL_SOURCES + ("bindings.cpp",)
HEADERS = ("native.h", "attend.h", "step.h", "pool.h", "linear_tiles.h", "combine_tiles.h", "linear_ymm.h",
           "linear_neon.h", "x86_avx2.h")
# No -std here: torch.utils.cpp_extension passes the standard its own headers need (C++20 from torch 2.13 on; the
# sources are C++17 and build under either), and a -std of ours after it would override it: torch 2.14's headers
# refuse C++17, so the build failed there and the runtime fell back to the cpu backend.
CFLAGS = ["-O3", "-pthread", "-ffp-contract=off", "-fno-math-errno", "-Wall", "-Wno-unused-function"]
ISA_ENV = "BITNEST_NATIVE_ISA"
LOCK_TIMEOUT_ENV = "BITNEST_BUILD_LOCK_TIMEOUT"   # seconds a load waits for another process's build (default 1800)
BUILD_LOCK, BUILD_LOG = "build.lock", "builds.log"
STALE_BATON_ENV = "BITNEST_STALE_BATON_S"   # seconds with nothing written in the build folder after which cpp_extension's
STALE_BATON_S = 900                         # own lock file is a killed build's (default 900)
ISA_NAMES = ("avx512-vnni", "avx-vnni", "avx2", "neon-sdot", "neon-widen", "generic")   # native.h isa_names(), best first
_FOLDER = Path(__file__).resolve().parent
_loaded: Optional[bool] = None
_failure: Optional[str] = None


class NativeUnavailable(RuntimeError):
    """The native plugins cannot be built or loaded here; the message is one line naming the cause."""


def build_folder() -> Path:
    cache = Path(os.environ.get("BITNEST_CACHE") or Path.home() / ".cache" / "bitnest-edge")   # edge.cache's rule
    return cache / "native" / f"torch-{torch.__version__}-{platform.machine()}"


def source_hash() -> str:
    """sha256 (16 hex digits) of every source and header the library is built from."""
    import hashlib
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update((_FOLDER / name).read_bytes())
    return h.hexdigest()[:16]


def _cpp_extension():
    """torch.utils.cpp_extension, imported without the warning a CUDA build of torch logs at that import where it finds
    a CUDA_HOME but no CUDA runtime (a CPU machine): the native step is CPU code, and the line would break every
    command's one-line error there."""
    import logging
    log = logging.getLogger("torch.utils.cpp_extension")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension
    finally:
        log.setLevel(level)
    return cpp_extension


def _preflight() -> Optional[str]:
    """The reason the library cannot be built here, or None."""
    cpp_extension = _cpp_extension()
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return f"no C++ compiler ({cxx} not found): install g++ (apt-get install g++)"
    if not cpp_extension.is_ninja_available():
        return "ninja is not installed: pip install ninja"
    return None


@contextmanager
def build_lock(folder: Path):
    """Hold the exclusive lock on folder/BUILD_LOCK (waiting up to BITNEST_BUILD_LOCK_TIMEOUT seconds for another
    process's build): writing the ninja file, compiling, linking and loading happen under it, so a second process
    finds the library built and only loads it. flock locks die with their process: no stale lock survives a crash."""
    import fcntl
    timeout = float(os.environ.get(LOCK_TIMEOUT_ENV, "1800"))
    path = folder / BUILD_LOCK
    with open(path, "a") as f:
        start = time.monotonic()
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() - start > timeout:
                    raise NativeUnavailable(f"another process has held the native build lock {path} for over "
                                            f"{timeout:.0f} s (raise {LOCK_TIMEOUT_ENV} or end that process)") from None
                time.sleep(0.1)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _clear_stale_baton(folder: Path) -> None:
    """Remove cpp_extension's lock file `lock` where a killed build left it (cpp_extension waits for it to vanish,
    forever): only when no other file of the folder has been written for BITNEST_STALE_BATON_S seconds, since a
    process of older code may build here without the build lock, and a live build writes an object file every few
    seconds."""
    baton = folder / "lock"
    stale = float(os.environ.get(STALE_BATON_ENV, STALE_BATON_S))
    try:
        newest = max(f.stat().st_mtime for f in folder.iterdir() if f.name not in (BUILD_LOCK, baton.name))
        if baton.exists() and time.time() - newest > stale:
            baton.unlink()
    except (ValueError, OSError):
        pass


def _build_and_load(folder: Path) -> Optional[str]:
    """Under the build lock: build if needed, load, log a build that made a new library; the failure's reason or None."""
    cpp_extension = _cpp_extension()
    _clear_stale_baton(folder)
    lib = folder / "bitnest_native.so"
    before = lib.stat().st_mtime_ns if lib.is_file() else None  # built before: no compiler needed unless sources changed
    reason = None if before is not None else _preflight()
    if reason is not None:
        return reason
    try:   # the sources' hash is a flag, so a changed header rebuilds too (cpp_extension hashes sources only)
        cpp_extension.load(name="bitnest_native", sources=[str(_FOLDER / s) for s in SOURCES],
                           extra_cflags=CFLAGS + [f"-DBITNEST_SOURCES={source_hash()}"], extra_ldflags=["-pthread"],
                           build_directory=str(folder), is_python_module=False, verbose=False)
    except (RuntimeError, OSError, ImportError) as e:
        lines = [ln for ln in str(e).splitlines() if "error" in ln.lower()] or str(e).splitlines() or [repr(e)]
        return f"building the native plugins failed ({lines[0].strip()[:200]}); build log in {folder}"
    if lib.stat().st_mtime_ns != before:
        with open(folder / BUILD_LOG, "a") as log:
            log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} pid {os.getpid()} sources {source_hash()}\n")
    return None


def load() -> None:
    """Build (once, cached) and load the native library; NativeUnavailable with the reason where that fails."""
    global _loaded, _failure
    if _loaded:
        return
    if _failure is not None:
        raise NativeUnavailable(_failure)
    folder = build_folder()
    folder.mkdir(parents=True, exist_ok=True)
    with build_lock(folder):
        reason = _build_and_load(folder)
    if reason is not None:
        _failure = reason
        raise NativeUnavailable(reason)
    _loaded = True


def unavailable() -> Optional[str]:
    """None where the native plugins load here, else the one-line reason."""
    try:
        load()
    except NativeUnavailable as e:
        return str(e)
    return None


def requested_isa() -> str:
    """The kernel set forced by BITNEST_NATIVE_ISA ('' = the best this CPU runs)."""
    return os.environ.get(ISA_ENV, "")


def best_isa() -> str:
    """Name of the kernels this CPU runs best (one of ISA_NAMES)."""
    load()
    return torch.ops.bitnest.isa()


def runnable_isas() -> list[str]:
    """The kernel sets this CPU and OS run, best first."""
    load()
    return [n.strip() for n in torch.ops.bitnest.runnable_isas().split(",") if n.strip()]


def isa_problem() -> Optional[str]:
    """None where BITNEST_NATIVE_ISA is unset or names a kernel set this CPU runs, else the one-line reason."""
    isa = requested_isa()
    if not isa:
        return None
    if isa not in ISA_NAMES:
        return f"{ISA_ENV}={isa} names no kernel set (use one of {', '.join(ISA_NAMES)}, or unset it)"
    runs = runnable_isas()
    if isa not in runs:
        return f"{ISA_ENV}={isa}: this CPU does not run it (it runs {', '.join(runs)}; unset {ISA_ENV} for the best)"
    return None


def dual_plane_linear(x: torch.Tensor, base: torch.Tensor, refine: Optional[torch.Tensor], scale: torch.Tensor,
                      view: str, offset: Optional[torch.Tensor] = None, isa: str = "") -> torch.Tensor:
    """y [M, N] float32 = x [M, K] @ W_view^T with per-token INT8 activations (plugins.reference semantics with
    act_int8=True); canonical planes uint8 [N, K/2], scale (and offset) float16 [N, K/G]."""
    load()
    check_view(view)
    return getattr(torch.ops.bitnest, DUAL_PLANE_LINEAR.python)(x, base, refine, scale, view, offset, isa or requested_isa())


def nested_kv_attention(q: torch.Tensor, base: torch.Tensor, refine: torch.Tensor, scale: torch.Tensor,
                        main_len: int, kv8_from: int, scratch=None, scratch_len: int = 0, isa: str = "",
                        window: int = 0) -> torch.Tensor:
    """out [Hq, T, D] float32: plugins.reference.nested_kv_attention's semantics over the nested planes. `refine` may
    be a ring of R <= capacity slots (position p's refinement in slot p mod R); `window` > 0: query t reads KV8 only
    for positions >= its own + 1 - window (elastic KV)."""
    load()
    sb, sr, ss = scratch if scratch is not None else (None, None, None)
    return getattr(torch.ops.bitnest, NESTED_KV_ATTENTION.python)(q, base, refine, scale, main_len, kv8_from, sb, sr, ss,
                                                                   scratch_len, window, isa or requested_isa())


def quantize_kv(x: torch.Tensor, isa: str = "") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """plugins.kv.quantize_kv in C++ (the step's KV write, with the kernel set's vector code): base, refine uint8
    [..., D/2], scale float16 [...]."""
    load()
    return torch.ops.bitnest.quantize_kv(x, isa or requested_isa())
