"""Device profiles for memory planning (docs/memory.md): total memory, what the OS and the CUDA context keep,
bandwidth; Jetson presets, the local machine and a CUDA GPU queried at run time, with overrides."""

import os
from dataclasses import dataclass, replace

from edge.errors import BitNestError

MiB = 1 << 20
GiB = 1 << 30

# JetPack 6 figures. Totals are the RAM Linux reports (tegrastats `RAM used/TOTAL`, = MemTotal) after the
# firmware carve-outs, read off real tegrastats lines: 7620 MB on an Orin Nano/NX 8 GB (docs/energy.md),
# 15656 MB on an Orin NX 16 GB, 30697 MB on an AGX Orin 32 GB and 62841 MB on an AGX Orin 64 GB
# (JetPack 6 tegrastats output published in public repositories). Idle "RAM used" on those lines is
# 0.8-1.3 GB headless and 2.3-3.4 GB with the desktop; OS_RESERVE takes 1.5 GiB (headless, plus sshd,
# jtop service and page cache kept hot), a desktop session needs --os-reserve-mib 3500.
# CONTEXT_RESERVE is what a CUDA process holds before it allocates a tensor on Jetson's shared memory:
# the CUDA context, cuBLAS/cuDNN or TensorRT kernels (lazy module loading, CUDA 12 default) and the
# Python/torch libraries. 1 GiB is our estimate for JetPack 6 (CUDA 12.6, TensorRT 10.3): measure it on
# the device as the tegrastats RAM delta of `python -c "import torch; torch.zeros(1, device='cuda')"`
# and pass --context-reserve-mib.
OS_RESERVE = int(1.5 * GiB)
CONTEXT_RESERVE = 1 * GiB


@dataclass(frozen=True)
class DeviceProfile:
    """Memory a runtime may plan with: total - os_reserve - context_reserve."""

    name: str
    total_bytes: int
    os_reserve_bytes: int
    context_reserve_bytes: int
    bandwidth_gb_s: float | None
    unified: bool                 # CPU and GPU share one memory (Jetson), so every byte counts once
    compute: str                  # "gpu" (fp16 activations, fused kernels) or "cpu" (this runtime's torch path)
    source: str                   # where the figures come from

    def __post_init__(self):
        if self.total_bytes <= 0:
            raise BitNestError(f"device {self.name}: total memory must be positive")
        if self.os_reserve_bytes < 0 or self.context_reserve_bytes < 0:
            raise BitNestError(f"device {self.name}: reserves cannot be negative")
        if self.usable_bytes <= 0:
            raise BitNestError(f"device {self.name}: the reserves ({self.os_reserve_bytes + self.context_reserve_bytes} "
                               f"bytes) exceed the total ({self.total_bytes}): lower --os-reserve-mib/--context-reserve-mib")

    @property
    def usable_bytes(self) -> int:
        return self.total_bytes - self.os_reserve_bytes - self.context_reserve_bytes

    def override(self, total_mib: float | None = None, os_reserve_mib: float | None = None,
                 context_reserve_mib: float | None = None) -> "DeviceProfile":
        """The profile with any of its figures replaced (MiB); the source says what was overridden."""
        kw, said = {}, []
        for field, v in (("total_bytes", total_mib), ("os_reserve_bytes", os_reserve_mib),
                         ("context_reserve_bytes", context_reserve_mib)):
            if v is not None:
                if not 0 <= v < 1 << 40:        # MiB: a petabyte is past any device, and nan / inf are no size
                    raise BitNestError(f"--{field.replace('_bytes', '').replace('_', '-')}-mib must be a size in "
                                       f"MiB, got {v}")
                kw[field] = int(v * MiB)
                said.append(f"{field.replace('_bytes', '')}={v} MiB")
        return replace(self, **kw, source=self.source + ("; overridden: " + ", ".join(said) if said else "")) if kw else self

    def to_dict(self) -> dict:
        return {"name": self.name, "total_bytes": self.total_bytes, "os_reserve_bytes": self.os_reserve_bytes,
                "context_reserve_bytes": self.context_reserve_bytes, "usable_bytes": self.usable_bytes,
                "bandwidth_gb_s": self.bandwidth_gb_s, "unified": self.unified, "compute": self.compute,
                "source": self.source}


def _jetson(name: str, total_mb: int, bandwidth: float, module: str) -> DeviceProfile:
    return DeviceProfile(name, total_mb * MiB, OS_RESERVE, CONTEXT_RESERVE, bandwidth, True, "gpu",
                         f"{module}: MemTotal {total_mb} MB (tegrastats, JetPack 6), LPDDR5 {bandwidth} GB/s; "
                         "reserves: headless JetPack 6 OS 1.5 GiB, CUDA context + kernels + libraries 1 GiB (estimates)")


PRESETS = {
    "orin-nx-8gb": _jetson("orin-nx-8gb", 7620, 102.4, "Jetson Orin NX 8 GB"),
    "orin-nx-16gb": _jetson("orin-nx-16gb", 15656, 102.4, "Jetson Orin NX 16 GB"),
    "orin-nano-8gb": _jetson("orin-nano-8gb", 7620, 68.0, "Jetson Orin Nano 8 GB (102 GB/s in the JetPack 6.2 super modes)"),
    "agx-orin-32gb": _jetson("agx-orin-32gb", 30697, 204.8, "Jetson AGX Orin 32 GB"),
    "agx-orin-64gb": _jetson("agx-orin-64gb", 62841, 204.8, "Jetson AGX Orin 64 GB"),
}
QUERIED = ("cuda", "local")
DEVICES = tuple(PRESETS) + QUERIED


def meminfo(path: str = "/proc/meminfo") -> dict[str, int]:
    """/proc/meminfo in bytes by field name."""
    out = {}
    with open(path) as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
    return out


def process_rss_bytes(field: str = "VmRSS") -> int:
    """Resident set size of this process (VmRSS), or its peak so far with field="VmHWM"."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise BitNestError(f"cannot read {field} from /proc/self/status")


def release_freed_heap() -> bool:
    """After loading: collect loading's cyclic garbage and hand the heap pages it freed back to the OS (glibc's
    malloc_trim; False where there is no glibc). glibc keeps freed small chunks in its heaps: loading the default
    model's RTN export left 3 to 133 MB of them resident, varying run to run with the threads' interleaving, and
    1 to 3 MB once trimmed (edge/memory/verify.py's breakdown, `bitnest max-context --verify`)."""
    import gc
    gc.collect()
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return True
    except (OSError, AttributeError):
        return False


def local_profile() -> DeviceProfile:
    """This machine: MemTotal; what other processes hold now (MemTotal - MemAvailable) as the OS reserve;
    this process's current resident size (interpreter, torch) as the context reserve."""
    try:
        m = meminfo()
    except OSError as e:
        raise BitNestError(f"cannot read /proc/meminfo ({e}): use a preset --device") from None
    total, avail = m["MemTotal"], m.get("MemAvailable", m.get("MemFree", 0))
    rss = process_rss_bytes()
    return DeviceProfile("local", total, max(0, total - avail - rss), rss, None, False, "cpu",
                         f"this machine: /proc/meminfo MemTotal, others' use = MemTotal - MemAvailable, "
                         f"this process's VmRSS ({os.getpid()}) as the runtime reserve")


def cuda_profile(index: int = 0) -> DeviceProfile:
    """The CUDA GPU `index`, queried through torch.cuda (imported here only): total memory, what is
    already taken (other processes and this one's context) as the context reserve."""
    import torch
    if not torch.cuda.is_available():
        raise BitNestError("--device cuda needs a CUDA GPU and a CUDA build of torch: none is visible here; "
                           "use --device local or a Jetson preset")
    free, total = torch.cuda.mem_get_info(index)
    props = torch.cuda.get_device_properties(index)
    integrated = bool(getattr(props, "is_integrated", False))
    return DeviceProfile("cuda", total, 0, total - free, None, integrated, "gpu",
                         f"{props.name}: torch.cuda.mem_get_info (total {total}, free {free}); "
                         "memory already in use counts as the context reserve")


def get_profile(name: str) -> DeviceProfile:
    """A preset by name, or the queried `local` / `cuda` profile."""
    if name in PRESETS:
        return PRESETS[name]
    if name == "local":
        return local_profile()
    if name == "cuda":
        return cuda_profile()
    raise BitNestError(f"unknown device {name!r}: use one of {', '.join(DEVICES)}")
