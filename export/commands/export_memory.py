"""`bitnest export-memory` (scripts/export_memory.py): the streamed export's peak memory and time per block at a
model's real shapes, against its plan (export.tools.export_memory)."""

import json
import shutil

from export.tools.export_memory import measure
from pathlib import Path


def parser():
    """The command's options (main parses them)."""
    from edge.argtypes import Parser, count
    from edge.memory.model_shapes import MODEL_PRESETS
    p = Parser(prog="bitnest export-memory", description=main.__doc__)
    p.add_argument("--shape", choices=sorted(MODEL_PRESETS), default="llama-3-8b", help="the model's shapes")
    p.add_argument("--layers", type=count(), nargs="+", default=[2, 4], help="block counts, one export each")
    p.add_argument("--calib-samples", type=count(), default=8, help="calibration windows of each export")
    p.add_argument("--calib-seq-len", type=count(16), default=128, help="tokens per window")
    p.add_argument("--method", choices=("bitnest", "rtn"), default="bitnest")
    p.add_argument("--work", help="folder for the synthetic sources and exports (default: a temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the exports in --work (export-N: a checkpoint of N blocks)")
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--json", action="store_true", help="print one JSON object last")
    return p


def main(argv=None) -> int:
    """`bitnest export-memory`: the streamed export's peak memory at a preset's shapes, as JSON."""
    import tempfile

    from edge.atomic import write_atomic
    from edge.options.run import run_cli
    from edge.memory.model_shapes import MODEL_PRESETS
    a = parser().parse_args(argv)

    def body():
        work = Path(a.work or tempfile.mkdtemp(prefix="bitnest-export-memory-"))
        result = {"preset": a.shape, **measure(MODEL_PRESETS[a.shape], a.layers, work, a.calib_samples,
                                               a.calib_seq_len, a.method, a.keep and bool(a.work))}
        if a.out:
            write_atomic((json.dumps(result, indent=1) + "\n").encode(), Path(a.out))
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
        return result

    return run_cli(body, a.json, "bitnest export-memory")
