"""Peak host RSS of reading a model source, each way in a fresh process: the streamed source (export.stream_source,
every tensor once, whole or in row blocks) against today's whole float32 load (export.sources.load_source); prints
JSON. `python scripts/source_rss.py [--model default] [--rows 4096]`."""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("imports", "stream-cold", "stream", "stream-rows", "whole-cold", "whole")   # -cold: an empty cache


def measure(mode: str, model: str, rows: int) -> dict:
    """Run one mode in this process (a fresh child): peak RSS in MB, seconds, float32 MB read. Every tensor is summed
    once, so that pages a loader maps lazily are counted as the exporter would touch them."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch  # noqa: F401  (every mode pays for torch)

    from export.sources import load_source, open_source
    t0, nbytes = time.perf_counter(), 0
    if mode.startswith("whole"):
        src = load_source(model)
        nbytes = sum(t.numel() * 4 + 0 * float(t.sum()) for t in src.tensors.values())
    elif mode.startswith("stream"):
        with open_source(model) as src:
            for name in src.names():
                shape = src.shape(name)
                blocks = [None] if mode != "stream-rows" or len(shape) != 2 else \
                    [slice(a, a + rows) for a in range(0, shape[0], rows)]
                for block in blocks:
                    t = src.get(name, block)
                    nbytes += t.numel() * 4 + 0 * float(t.sum())
    return {"mode": mode, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "seconds": round(time.perf_counter() - t0, 2), "float32_mb": nbytes / 2**20}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--rows", type=int, default=4096, help="row block for stream-rows")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.model, args.rows)))
        return 0
    out = []
    for mode in MODES:   # the warm modes read the cache that earlier runs filled
        cold = tempfile.mkdtemp(prefix="bitnest-rss-")
        env = {**os.environ, **({"BITNEST_CACHE": cold} if "cold" in mode else {})}
        try:
            run = subprocess.run([sys.executable, __file__, "--child", mode, "--model", args.model, "--rows",
                                  str(args.rows)], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
        finally:
            shutil.rmtree(cold, ignore_errors=True)
        out.append(json.loads(run.stdout.strip().splitlines()[-1]))
    print(json.dumps({"model": args.model, "runs": out}, indent=1))
    return 0


if __name__ == "__main__":
    sys.path[0] = str(ROOT)
    sys.exit(main())
