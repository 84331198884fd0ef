"""Launch capture: the kernels the launchers really launch, compiled for a GPU this machine need not have.

`aot` compiles specs that mirror the launchers (argument types, constants, warps, stages, register caps written out
by hand); a launcher that drifts from its spec would leave the proxy measuring a kernel that never runs. Under
`captured_launches(arch)` a launcher runs as on a CUDA GPU of compute capability `arch` with tensors on the CPU:
Triton's JIT binds the real arguments, specializes them (16-byte alignment, integers divisible by 16) and parses
the launch's options as it does on a device, so an option this Triton does not know fails here as it would there;
each new variant is compiled for sm_`arch` and recorded, and no kernel runs (outputs stay as allocated: the values
a captured pass computes mean nothing). `launch_spec` turns a recorded launch into `aot`'s KernelSpec, so the proxy
and its budgets apply to exactly what ran.

The hooks are Triton's JIT internals as they stand in 3.6 (the H100/H200 image), 3.8 (JetPack 6's newest wheel)
and 3.9 (this project's pin): `triton.runtime.driver.set_active` takes the driver object the JIT asks for its
device, stream and target (`_active` holds it, None until first asked), and `JITFunction._do_compile(key,
signature, device, constexprs, options, attrs, warmup)` compiles a variant and caches it; the launch then calls the
cached kernel's `launch_metadata` and `run`.
"""

import contextlib
from dataclasses import dataclass, field, replace

import torch
from triton.backends.compiler import GPUTarget
from triton.runtime import driver
from triton.runtime.jit import JITFunction

from plugins.kernels import attention, gemv_decode
from plugins.kernels.aot import KernelSpec, decode_loop_bytes, held_to_budget
from plugins.kernels.common import CAPTURES


@dataclass(frozen=True)
class Launch:
    """One compiled variant a launcher launched: its kernel (the JITFunction), argument types by name ("constexpr"
    for constants), constants by name, the options Triton parsed from the launch, and the specialization Triton
    gave its arguments (argument index path -> attributes: 16-byte aligned pointers, integers divisible by 16)."""

    fn: object
    signature: dict
    constexprs: dict
    options: dict
    attrs: dict
    kernel: object = field(default=None, compare=False)    # what Triton compiled (its CompiledKernel)

    @property
    def name(self) -> str:
        return self.fn.fn.__name__


@dataclass(frozen=True)
class LaunchSpec(KernelSpec):
    """`aot.KernelSpec` of a captured launch: compiled with the specialization the launch got, not the spec's
    assumption that every pointer is aligned."""

    launched_attrs: dict = None

    def attrs(self) -> dict:
        return self.launched_attrs


class _Driver:
    """What Triton's JIT asks a driver while it binds and compiles a launch: device 0, stream 0, sm_`arch`."""

    def __init__(self, arch: int):
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return torch.device("cpu")

    def is_active(self):
        return True


class _NotLaunched:
    """The cached kernel of a captured variant: its launch does nothing."""

    function = packed_metadata = None

    def launch_metadata(self, *args):
        return None

    def run(self, *args, **kwargs):
        return None


def _record(launches: list, ptx_version: int | None, stubs: list, compile_them: bool):
    compile_variant = JITFunction._do_compile

    def do_compile(self, key, signature, device, constexprs, options, attrs, warmup):
        if ptx_version is not None:
            options = replace(options, ptx_version=ptx_version)
        kernel = compile_variant(self, key, signature, device, constexprs, options, attrs, warmup) \
            if compile_them else None                                                                # sm_arch
        names = [p.name for p in self.params]
        launches.append(Launch(self, dict(signature), {names[path[0]]: v for path, v in constexprs.items()},
                               {k: getattr(options, k, None) for k in ("num_warps", "num_stages", "maxnreg",
                                                                       "enable_fp_fusion", "launch_pdl")},
                               dict(attrs), kernel))
        cache = self.device_caches[device][0]
        cache[key] = _NotLaunched()
        stubs.append((cache, key))         # taken out on exit: a launch after the capture compiles for real
        return cache[key]
    return compile_variant, do_compile


# SMs of the GPU a capture stands for, by compute capability: Orin NX (the product's device; AGX Orin has 16), and
# the H100 / H200 (132 SMs both)
CAPTURE_SMS = {87: 8, 90: 132}


@contextlib.contextmanager
def captured_launches(arch: int = 87, ptx_version: int | None = None, sms: int | None = None,
                      compile_them: bool = True):
    """Within it, the Triton launches of this process compile for sm_`arch` and do not run; yields the list their
    variants are appended to, in launch order. `ptx_version`: the PTX ISA (x10) to emit instead of Triton's default
    (on a device the installed CUDA's ptxas sets it: `aot.JETPACK6_PTX` for a Jetson); `sms`: the GPU's SMs, which
    the GEMV's split of K is planned for (default CAPTURE_SMS's, else 8). Needs the compiler (not
    TRITON_INTERPRET=1); restores Triton's driver, compile path and kernel caches on exit (each capture compiles
    and records every variant it launches, none left behind as a launch that does nothing). `compile_them` False
    records each variant's signature, constants and options without compiling it (Launch.kernel None): what the
    launchers pass, in seconds."""
    launches: list[Launch] = []
    stubs: list = []
    compile_variant, do_compile = _record(launches, ptx_version, stubs, compile_them)
    previous = driver._active     # None until a first launch asks: reset_active would make one (no GPU: fails)
    driver.set_active(_Driver(arch))
    JITFunction._do_compile = do_compile
    CAPTURES.append((arch, sms or CAPTURE_SMS.get(arch, 8)))
    try:
        yield launches
    finally:
        CAPTURES.pop()
        JITFunction._do_compile = compile_variant
        driver._active = previous
        for cache, key in stubs:
            cache.pop(key, None)


def launch_spec(launch: Launch, name: str) -> LaunchSpec:
    """`aot`'s KernelSpec, named `name`, of a captured launch: a decode GEMV's main-loop plane bytes and budget
    (`aot.BUDGETS`, held as `aot.held_to_budget` holds its variant), the attention kernels' KV bytes a position step
    (their budgets: decoding's, a prefill tile's); any other kernel is compiled and summarized without a proxy."""
    c, o = launch.constexprs, launch.options
    extra = {}
    if launch.fn is gemv_decode.decode_gemv_kernel:
        extra = {"loop_weight_bytes": decode_loop_bytes(c), "decode": True,
                 "held": held_to_budget(bool(c["TARGET"] or c["RUNTIME_VIEW"]), c["M"], c["G"])}
    elif launch.fn in (attention.flash_decode_kernel, attention.flash_prefill_kernel):
        extra = {"kv_step_bytes": c["BLOCK_S"] * c["D"]}
    return LaunchSpec(name, launch.fn, launch.signature, c, o["num_warps"], num_stages=o["num_stages"],
                      maxnreg=o["maxnreg"], launched_attrs=launch.attrs, **extra)


def distinct(launches: list[Launch]) -> dict[str, Launch]:
    """{name: launch} of the variants of one capture (each a compile of its own: Triton compiles a launch whose
    constants, options or specialization differ), in launch order, named after the kernel and the constants that
    tell it from the other variants of the same kernel (e.g. decode_gemv_kernel_M5_TARGET1_G64); variants that
    differ in specialization alone (a pointer not 16-byte aligned) take a suffix _v2, _v3, ..."""
    by_fn: dict = {}
    for launch in launches:
        by_fn.setdefault(launch.fn, []).append(launch)
    out = {}
    for launch in launches:
        same = by_fn[launch.fn]
        keys = [k for k in launch.constexprs if len({repr(v.constexprs.get(k)) for v in same}) > 1]
        name = "_".join([launch.name] + [f"{k}{_short(launch.constexprs[k])}" for k in keys])
        n = 1
        while (name if n == 1 else f"{name}_v{n}") in out:
            n += 1
        out[name if n == 1 else f"{name}_v{n}"] = launch
    return out


def _short(v) -> str:
    return str(int(v)) if isinstance(v, bool) else str(v)
