"""What `--weights base` saves, measured: one fresh process per weight set (`nested`, `base`) loads the runtime on a
checkpoint, answers real prompts with the `draft` policy and reports its resident memory and the bytes it read from
files; the parent sets them against the refinement planes' bytes the base load leaves out (read from the weights
file's header).

    python scripts/weights_memory.py [--checkpoint DIR] [--backend native|cpu|torch] [--prompts N] [--max-new-tokens N]
"""

import json
import subprocess
import sys
from pathlib import Path

from edge.analysis.bench.process import ROOT, worker_env
from edge.errors import BitNestError

WEIGHTS = ("nested", "base")


def _status() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile of this process, bytes."""
    keys, out = ("VmRSS", "VmHWM", "RssAnon", "RssFile"), {}
    with open("/proc/self/status") as f:
        for line in f:
            k = line.split(":")[0]
            if k in keys:
                out[k] = int(line.split()[1]) * 1024
    return out


def read_chars() -> tuple[int, int]:
    """Bytes this process has read through read/pread system calls before this call (/proc/self/io rchar; mapped-file
    page faults are not counted) and the bytes this call's own read of /proc/self/io adds (its length varies with the
    counters' digits): what was read between calls a and b is b[0] - a[0] - a[1]."""
    with open("/proc/self/io", "rb") as f:
        text = f.read()
    return next(int(line.split()[1]) for line in text.splitlines() if line.startswith(b"rchar:")), len(text)


def unread_refinement_bytes(checkpoint) -> dict:
    """The weight files' size, every refinement plane's bytes, and those a `base` load leaves out (the draft reads
    the rest: edge.model.checkpoint.draft_reads_refine)."""
    from edge.model.checkpoint import draft_reads_refine
    from edge.model.manifest import read_manifest, weight_files
    from edge.model.tensor_file import read_header
    m = read_manifest(Path(checkpoint))
    refine, size = {}, 0
    for name in weight_files(Path(checkpoint), m):
        path = Path(checkpoint) / name
        with open(path, "rb") as f:
            entries, file_size = read_header(f, path)
        size += file_size
        refine.update({n: e[3] - e[2] for n, e in entries.items() if n.endswith(".refine")})
    left = sum(b for n, b in refine.items() if not draft_reads_refine(m, n[:-len(".refine")]))
    return {"file_bytes": size, "refinement_bytes": sum(refine.values()), "unread_by_base_bytes": left}


def child(checkpoint: str, backend: str, weights: str, prompts: list[str], max_new_tokens: int) -> dict:
    """In a fresh process: the runtime loaded with `weights`, its memory after loading and after answering
    `prompts` with the draft policy, the bytes read by system calls while loading, and the answers' tokens."""
    import transformers  # noqa: F401  (imported before the count: its modules' files are not the checkpoint)

    from edge.decode.config import GenerateConfig
    from edge.energy import make_meter
    from edge.llm import LLM
    meter = make_meter("none")      # made before the count: the meter's modules are not the checkpoint either
    before, (r0, own) = _status(), read_chars()
    rt = LLM(checkpoint, policy="draft", backend=backend, max_context=1024, weights=weights, meter=meter)
    read = read_chars()[0] - r0 - own   # before _status: /proc/self/status's length varies with its figures' digits
    loaded = _status()
    tokens = [rt.generate(rt.encode(p), config=GenerateConfig(policy="draft", max_new_tokens=max_new_tokens)).tokens
              for p in prompts]
    return {"weights": weights, "backend": rt.backend, "before": before, "loaded": loaded, "answered": _status(),
            "read_while_loading_bytes": read, "tokens": tokens}


def run_child(checkpoint, backend: str, weights: str, prompts: list[str], max_new_tokens: int) -> dict:
    """`child` in its own process (fresh heap, nothing loaded before)."""
    spec = json.dumps({"checkpoint": str(checkpoint), "backend": backend, "weights": weights, "prompts": prompts,
                       "max_new_tokens": max_new_tokens})
    try:
        r = subprocess.run([sys.executable, "-m", "edge.analysis.weights_memory", "--child", spec], cwd=ROOT,
                           env=worker_env(), capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        raise BitNestError(f"the {weights} run took over 30 minutes: answer fewer prompts (--prompts)") from None
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        raise BitNestError(f"the {weights} run failed: {tail[:200]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def compare(checkpoint, backend: str, prompts: list[str], max_new_tokens: int) -> dict:
    """Both runs and what `base` saved of resident memory (after loading, after answering, peak) against the
    refinement planes it left out; whether their answers are the same tokens."""
    import compileall
    for package in ("edge", "plugins"):   # both children then read the same bytecode: only the checkpoint's reads differ
        compileall.compile_dir(str(ROOT / package), quiet=1)
    runs = {w: run_child(checkpoint, backend, w, prompts, max_new_tokens) for w in WEIGHTS}
    planes = unread_refinement_bytes(checkpoint)
    saved = {f"{when}_{k}": runs["nested"][when][k] - runs["base"][when][k]
             for when in ("loaded", "answered") for k in ("VmRSS", "RssAnon")}
    saved["peak_VmHWM"] = runs["nested"]["answered"]["VmHWM"] - runs["base"]["answered"]["VmHWM"]
    # what loading took at its peak beyond the process before it, over the weight bytes the load keeps
    kept = {"nested": planes["file_bytes"], "base": planes["file_bytes"] - planes["unread_by_base_bytes"]}
    load_peak = {w: round((runs[w]["loaded"]["VmHWM"] - runs[w]["before"]["VmRSS"]) / kept[w], 4) for w in WEIGHTS}
    return {"checkpoint": str(checkpoint), "backend": runs["base"]["backend"], **planes, "saved_bytes": saved,
            "load_peak_over_weights": load_peak,
            "saved_over_unread": {k: round(v / planes["unread_by_base_bytes"], 4) for k, v in saved.items()},
            "same_tokens": runs["nested"]["tokens"] == runs["base"]["tokens"], "runs": runs}


if __name__ == "__main__":      # run_child's fresh process: one run, its figures as one JSON line
    spec = json.loads(sys.argv[sys.argv.index("--child") + 1])
    print(json.dumps(child(spec["checkpoint"], spec["backend"], spec["weights"], spec["prompts"],
                           spec["max_new_tokens"])))
