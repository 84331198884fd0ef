"""The machine a benchmark ran on, recorded beside its figures: CPU model, the instruction-set flags that decide which
kernels run, cache sizes, cores and threads, and the last-level cache size that sizes the read probe (a roofline
probe must stream from DRAM: its buffer is at least PROBE_LLC_MULTIPLE times the LLC)."""

import os
import platform
import re
import subprocess
from pathlib import Path

# The flags /proc/cpuinfo spells for the ISA paths a CPU step may take (docs/runtime.md): x86 AVX2 / AVX-512 / VNNI /
# AMX, ARM's dot product.
ISA_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "amx_int8",
             "asimddp")
PROBE_LLC_MULTIPLE = 4
PROBE_MIN_BYTES = 256 << 20
SYS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")


def _cpuinfo() -> dict[str, str]:
    """The first processor's `key: value` lines of /proc/cpuinfo (empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.split("\n\n")[0].splitlines():
        key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


def _size(text: str) -> int:
    """Bytes of a sysfs cache size (`48K`, `32768K`, `1M`)."""
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip())
    if not m:
        return 0
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def caches(folder: Path = SYS_CACHE) -> list[dict]:
    """cpu0's caches as the kernel lists them: level, type, bytes and the CPUs sharing each."""
    out = []
    for d in sorted(folder.glob("index*")):
        try:
            read = lambda name: (d / name).read_text().strip()
            out.append({"level": int(read("level")), "type": read("type"), "bytes": _size(read("size")),
                        "shared_cpu_list": read("shared_cpu_list")})
        except (OSError, ValueError):
            continue
    return out


def getconf_llc() -> int:
    """`getconf LEVEL3_CACHE_SIZE` in bytes (0 where it has no answer). glibc reads CPUID, which on some virtual
    machines reports the whole package's L3 where sysfs reports one complex's share."""
    try:
        r = subprocess.run(["getconf", "LEVEL3_CACHE_SIZE"], capture_output=True, text=True, timeout=10)
        return max(int(r.stdout.strip() or 0), 0)
    except (OSError, ValueError, subprocess.SubprocessError):
        return 0


def llc_bytes(found: list[dict] | None = None) -> dict:
    """The last-level cache: the largest of sysfs's deepest level and getconf's L3 (the larger is the safe one for
    a probe that must miss it), with both readings."""
    found = caches() if found is None else found
    data = [c for c in found if c["type"] in ("Unified", "Data")]
    deepest = max(data, key=lambda c: c["level"]) if data else None
    sysfs = deepest["bytes"] if deepest else 0
    conf = getconf_llc()
    return {"bytes": max(sysfs, conf), "sysfs_bytes": sysfs, "sysfs_level": deepest["level"] if deepest else None,
            "getconf_bytes": conf}


def probe_bytes(llc: int) -> int:
    """The read probe's buffer: PROBE_LLC_MULTIPLE x the LLC, rounded up to 64 MiB, at least PROBE_MIN_BYTES."""
    want = max(PROBE_LLC_MULTIPLE * llc, PROBE_MIN_BYTES)
    return -(-want // (64 << 20)) * (64 << 20)


def load_average() -> float | None:
    """The 1-minute load average (runnable processes, the run's own included): a busy machine says so in the JSON."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def machine(threads: int) -> dict:
    """CPU model, ISA flags (each present or not), caches, the LLC and the probe size, cores, the run's threads and
    the load average before it."""
    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    found = caches()
    llc = llc_bytes(found)
    return {"cpu": info.get("model name") or info.get("Hardware") or platform.processor() or platform.machine(),
            "arch": platform.machine(), "isa_flags": {f: f in flags for f in ISA_FLAGS},
            "caches": found, "llc": llc, "probe_bytes": probe_bytes(llc["bytes"]),
            "cores": os.cpu_count(), "threads": threads, "load_average_before": load_average()}
