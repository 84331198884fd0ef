"""What elastic KV trades (docs/memory.md; computed by edge.analysis.elastic_quality): the default model's
perplexity on long Shakespeare text as a function of the share of positions read at KV4, and greedy speculative
acceptance (γ = 4) in elastic mode; writes JSON and a PNG beside the max-context plot.

    python scripts/elastic_quality.py [--positions 4096] [--windows 2048,1024,512,256,128,64] \
        [--accept-windows 512,128,32] [--accept-prompt 1024] [--new-tokens 96] [--backend auto] \
        [--out scripts/results/elastic_quality.json] [--plot scripts/results/elastic_quality.png]
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path[0] = str(Path(__file__).resolve().parents[1])  # the repo root, not scripts/

from edge.analysis.elastic_quality import plot, run  # noqa: E402
from edge.argtypes import Parser, count  # noqa: E402
from edge.options.run import pyplot, run_cli  # noqa: E402
from edge.corpora import SHAKESPEARE_EVAL_WORKS, shakespeare_text  # noqa: E402


def windows(text: str) -> list[int]:
    try:
        out = [int(w) for w in text.split(",") if w]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of windows") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError("windows must be positive integers")
    return out


def main(argv=None) -> int:
    p = Parser(prog="elastic_quality.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--positions", type=count(2), default=4096, help="tokens of text scored (the model holds 8,192)")
    p.add_argument("--windows", type=windows, default=[2048, 1024, 512, 256, 128, 64])
    p.add_argument("--accept-windows", type=windows, default=[512, 128, 32])
    p.add_argument("--accept-prompt", type=count(2), default=1024, help="prompt tokens before the speculative run")
    p.add_argument("--new-tokens", type=count(), default=96)
    p.add_argument("--backend", default="auto")
    p.add_argument("--checkpoint", help="nested checkpoint (default: the embedded SmolLM2 export)")
    p.add_argument("--out", default="scripts/results/elastic_quality.json")
    p.add_argument("--plot", default="scripts/results/elastic_quality.png")
    a = p.parse_args(argv)

    def body() -> dict:
        from export.pipeline import ensure_default_checkpoint
        from edge.model.tokenizer import load_tokenizer
        ckpt = Path(a.checkpoint) if a.checkpoint else ensure_default_checkpoint()
        t0, load0 = time.time(), os.getloadavg()
        log = lambda r: print(json.dumps(r), file=sys.stderr, flush=True)
        result = run(ckpt, shakespeare_text(), load_tokenizer(ckpt), a.positions, a.windows, a.accept_windows,
                     a.accept_prompt, a.new_tokens, a.backend, log)
        result.update({"model": ckpt.name, "text": " + ".join(SHAKESPEARE_EVAL_WORKS) + " (from the start)",
                       "loadavg_start": load0, "loadavg_end": os.getloadavg(), "seconds": round(time.time() - t0, 1),
                       "command": "python scripts/elastic_quality.py " + " ".join(argv or sys.argv[1:])})
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(a.out + ".tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        tmp.replace(a.out)                                    # atomic
        plot(result, a.plot + ".tmp.png", pyplot("--plot"))
        os.replace(a.plot + ".tmp.png", a.plot)
        return result
    return run_cli(body, True, "elastic_quality.py")


if __name__ == "__main__":
    sys.exit(main())
