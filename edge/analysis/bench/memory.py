"""The bench's memory plan, made before any runner starts: each runner's resident bytes from the files it will load
(the checkpoint's weight files, a GGUF, the float32 model transformers builds, the probe's buffer) plus what its
process holds before it loads anything, and which runners run together: in the bench's order, each joins the first
group whose runners still fit beside it, so groups that do not fit together run one after another and a runner that
does not fit alone is skipped with a reason. At a 1.5B model on a 24 GB host the five policies, llama.cpp's four
runs and transformers' float32 model (7.3 GB) together outgrew the host and the out-of-memory killer took a runner.

Figures: each worker reports its peak resident bytes once loaded (VmHWM, `peak_rss_after_load` in the bench's
JSON, beside the plan). On the default model (python scripts/bench.py --repeats 1 --prompts 1 --max-new-tokens 8
--policy target --policy auto --peer llamacpp --peer hf): a policy runner 454 MB over a 166 MB checkpoint, llama.cpp
401 / 445 MB over 98 / 145 MB GGUFs, transformers 1,253 MB over 540 MB of float32 parameters, the probe 1,505 MB
over its buffer: a process holds ~300 MB besides what it loads (~720 MB with transformers). On Qwen2.5-Coder-0.5B
(scripts/results/bench-qwen2.5-coder-0.5b-sharegpt.json) transformers, loading the model's GGUF, peaked at 4.07 GB,
past the 3.60 GB planned without the file's 0.49 GB: the file is now counted too (4.14 GB). A GGUF is mapped and
read whole by llama.cpp; a policy runner holds its checkpoint's tensors once (the backends re-lay planes in place of
the canonical ones, never beside them).

What a process holds before it loads a file is measured, not assumed (`worker_base_bytes`): a child with the worker's
imports reports its peak resident bytes. torch's build sets it: a bench worker ready to load holds ~250 MB with the CPU
build and ~680 MB with the CUDA build a Jetson runs (JetPack's torch; measured on an x86 CPU with Python 3.10 and
torch 2.14.1's CUDA wheel), where a constant of the CPU build's planned a policy runner at 406 MB and it peaked at
812 MB.
"""

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

from edge.errors import BitNestError

MiB = 1 << 20
LOAD_BYTES = 64 * MiB               # what a load adds beside its files and the imports (measured ~45 MB, both builds)
HF_LOAD_BYTES = 480 * MiB           # the same for transformers' runner (its model classes; ~710 MB in all, CPU build)
BASE_TIMEOUT_S = 300                # the measuring child's imports (seconds on a PC, longer from a Jetson's eMMC)
MARGIN = 1.10                       # loads hold transient copies, the KV cache and activations come on top
HOST_SHARE = 0.90                   # of MemAvailable: what the runners may hold together, the rest left to the system


def available_bytes() -> int:
    """What the runners may hold together: HOST_SHARE of this host's MemAvailable."""
    from edge.memory.devices import meminfo
    return int(meminfo().get("MemAvailable", 0) * HOST_SHARE)


def worker_base_bytes() -> int:
    """The peak resident bytes of a process with a policy worker's imports (torch, transformers' tokenizer, the
    runtime), measured in a child started as the bench's workers are (their environment and interpreter), once for
    each PYTHONPATH (the environment that decides what imports)."""
    return _measured_base(os.environ.get("PYTHONPATH", ""))


@functools.lru_cache(maxsize=None)
def _measured_base(pythonpath: str) -> int:
    from edge.analysis.bench.process import ROOT, worker_env
    fix = "check that `python -m edge.analysis.bench.memory` runs in this environment"
    try:
        done = subprocess.run([sys.executable, "-m", "edge.analysis.bench.memory"], cwd=ROOT, env=worker_env(),
                              capture_output=True, text=True, timeout=BASE_TIMEOUT_S)
    except (subprocess.TimeoutExpired, OSError) as e:
        raise BitNestError(f"cannot measure a bench worker's imports ({e}): {fix}") from None
    try:
        return int(json.loads(done.stdout.strip().splitlines()[-1])["peak_rss_bytes"])
    except (ValueError, KeyError, IndexError, TypeError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise BitNestError(f"cannot measure a bench worker's imports (exit code {done.returncode}: {last}): "
                           f"{fix}") from None


def _checkpoint_bytes(folder: str) -> int:
    from edge.model.manifest import read_manifest, weight_files
    path = Path(folder)
    return sum((path / f).stat().st_size for f in weight_files(path, read_manifest(path)))


def _float32_bytes(checkpoint: str) -> int:
    """The float32 model transformers builds of the checkpoint's source: every parameter at 4 bytes."""
    from edge.memory.plan import dense_weight_bytes
    from edge.model.manifest import read_manifest
    from edge.model.arch import ModelConfig
    cfg = ModelConfig.from_dict(read_manifest(Path(checkpoint))["config"])
    return 2 * sum(dense_weight_bytes(cfg, "fp16").values())


def resident_bytes(spec: dict, checkpoint: str) -> int:
    """A runner's resident bytes once loaded, from its spec (edge.analysis.bench.common), the files it names and
    what a worker's process holds before it loads them (`worker_base_bytes`)."""
    kind, base = spec["kind"], worker_base_bytes()
    if kind == "policy":
        need = base + LOAD_BYTES + _checkpoint_bytes(spec["checkpoint"])
    elif kind in ("llamacpp", "llamacpp_native"):
        files = [spec["gguf"]] + ([spec["draft"]] if spec.get("draft") else [])
        need = base + LOAD_BYTES + sum(Path(f).stat().st_size for f in files)
    elif kind == "hf":       # from a GGUF, transformers holds the file's bytes too while it dequantizes them
        need = base + HF_LOAD_BYTES + _float32_bytes(checkpoint) + (Path(spec["gguf"]).stat().st_size
                                                                    if spec.get("gguf") else 0)
    elif kind == "probe":
        need = base + LOAD_BYTES + spec["nbytes"]
    else:
        need = base + LOAD_BYTES
    return int(need * MARGIN)


def memory_plan(specs: dict, checkpoint: str, budget: int | None = None) -> dict:
    """{"budget_bytes", "worker_base_bytes", "runners": {name: bytes}, "groups": [[name, ...], ...], "skipped":
    {name: reason}}: the runners of `specs` (in order) grouped first-fit within `budget` (default `available_bytes`).
    BitNestError where none of this runtime's policies fits alone."""
    budget = available_bytes() if budget is None else budget
    need = {name: resident_bytes(spec, checkpoint) for name, spec in specs.items()}
    groups, used, skipped = [], [], {}
    for name, b in need.items():
        if b > budget:
            skipped[name] = (f"needs ~{b / 2**30:.1f} GiB resident alone, {budget / 2**30:.1f} GiB available "
                             "(90% of MemAvailable, or --memory-mib)")
            continue
        fit = next((i for i, u in enumerate(used) if u + b <= budget), None)
        if fit is None:
            groups.append([])
            used.append(0)
            fit = len(groups) - 1
        groups[fit].append(name)
        used[fit] += b
    policies = [n for n, s in specs.items() if s["kind"] == "policy"]
    for what, names in (("this runtime's runners need", policies), ("the read probe needs", ["probe"])):
        names = [n for n in names if n in specs]
        if names and all(n in skipped for n in names):       # the bench means nothing without them
            raise BitNestError(f"{what} ~{need[names[0]] / 2**30:.1f} GiB{' each' * (len(names) > 1)} and "
                               f"{budget / 2**30:.1f} GiB is available: free memory, or give more with --memory-mib")
    return {"budget_bytes": budget, "worker_base_bytes": worker_base_bytes(), "runners": need, "groups": groups,
            "skipped": skipped}


def _report_base() -> None:
    """`worker_base_bytes`'s child: a policy worker's imports, then its peak resident bytes as one JSON line."""
    import edge.analysis.bench.runners  # noqa: F401  (torch: what a worker imports before its ready line)
    import edge.llm  # noqa: F401  (the runtime a policy runner loads through)
    from transformers import AutoTokenizer  # noqa: F401  (the tokenizer every policy load builds)
    from edge.memory.devices import process_rss_bytes
    print(json.dumps({"peak_rss_bytes": process_rss_bytes("VmHWM")}))


if __name__ == "__main__":
    _report_base()
