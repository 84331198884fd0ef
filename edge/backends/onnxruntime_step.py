"""`onnxruntime` backend: the exported decoder-step graph (CHECKPOINT/decoder_step.onnx) run by onnxruntime on
the CPU, with host-side nested KV planes for one sequence, one pass of M tokens at a time; the planes a pass
returns are the next pass's inputs (the contract in plugins.step_contract)."""

import json
from pathlib import Path

import numpy as np

from edge.engine.step_engine import StepEngine, check_graph_draft_head
from edge.errors import BitNestError
from edge.model.checkpoint import Checkpoint
from edge.model.manifest import weights_sha256
from plugins.contracts import view_code
from plugins.step_contract import (
    INPUT_IDS,
    ONNX_DIGEST_SUFFIX,
    KV8_FROM,
    LOGITS,
    ONNX_FILE,
    SEQ_LEN,
    VIEW,
    StepShapes,
    kv_inputs,
    kv_outputs,
    onnx_digests,
)

MAX_PASS_TOKENS = 64   # the graph takes any M; passes are bounded to keep prefill chunks' workspace small


def open_session(onnx_path, threads: int = 0, inline_functions: bool = False, expose: tuple[str, ...] = ()):
    """onnxruntime session over a step graph; a one-line BitNestError where that cannot be done here. With
    `inline_functions` the graph's local functions run as onnxruntime's standard kernels, and `expose` names
    intermediate values to return as well (plugins.onnx.ort_ops)."""
    path = Path(onnx_path)
    if not path.is_file():
        raise BitNestError(f"ONNX file {path} does not exist: write it with `python scripts/export.py --out CKPT "
                           "--existing --onnx`")
    check_digests(path)
    try:
        from plugins.onnx.ort_ops import ort_session
        return ort_session(path, threads, inline_functions, expose)
    except ImportError as e:
        raise BitNestError(f"onnxruntime path unavailable ({e}): pip install onnxruntime onnxruntime-extensions")
    except Exception as e:     # onnx / onnxruntime refuse a malformed graph with their own exception types
        raise BitNestError(f"{path} cannot be loaded ({e.__class__.__name__}: {_first_line(e)}): export it again "
                           "with `python scripts/export.py --out CKPT --existing --onnx`") from None


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:160]


def check_digests(path: Path) -> None:
    """The graph (and its external data) against the sha256 the export wrote beside it, where it wrote one."""
    sidecar = path.with_name(path.name + ONNX_DIGEST_SUFFIX)
    if not sidecar.is_file():
        return
    try:
        want = json.loads(sidecar.read_text())
    except (ValueError, UnicodeDecodeError):
        raise BitNestError(f"{sidecar} is not valid JSON: export the graph again") from None
    if not isinstance(want, dict) or onnx_digests(path) != want:
        raise BitNestError(f"{path} fails its sha256 check ({sidecar.name}): changed or truncated since export, "
                           "export it again with `python scripts/export.py --out CKPT --existing --onnx`")


class OnnxStepRunner:
    """One sequence's KV planes (numpy int32 words [2, Hkv, C, D/8] and float16 scales per layer) and passes
    through an ORT session."""

    def __init__(self, session, shapes: StepShapes, capacity: int, max_tokens: int = MAX_PASS_TOKENS):
        self.session, self.shapes, self.capacity, self.max_tokens = session, shapes, capacity, max_tokens
        self.planes = [(np.zeros(shapes.plane_shape(capacity), np.int32), np.zeros(shapes.plane_shape(capacity), np.int32),
                        np.zeros(shapes.scale_shape(capacity), np.float16)) for _ in range(shapes.layers)]
        self.out_names = [LOGITS] + [n for layer in range(shapes.layers) for n in kv_outputs(layer)]

    def execute(self, ids: list[int], view: str, seq_len: int, kv8_from: int) -> np.ndarray:
        """Pass over `ids` at positions [seq_len - M, seq_len): logits float32 [M, V]; the planes it returns (the
        entries of those positions written) replace the runner's."""
        return self.run(ids, view, seq_len, kv8_from)[0]

    def run(self, ids: list[int], view: str, seq_len: int, kv8_from: int,
            extra: tuple[str, ...] = ()) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """`execute`, also returning the session's outputs named in `extra` (values it exposes)."""
        m = len(ids)
        if not 1 <= m <= seq_len <= self.capacity:
            raise ValueError(f"a pass of {m} tokens ending at {seq_len} does not fit the capacity {self.capacity}")
        feeds = {INPUT_IDS: np.asarray(ids, np.int64), SEQ_LEN: np.asarray([seq_len], np.int64),
                 KV8_FROM: np.asarray([kv8_from], np.int64), VIEW: np.asarray([view_code(view)], np.int64)}
        for layer, planes in enumerate(self.planes):
            feeds.update(zip(kv_inputs(layer), planes))
        try:
            outs = self.session.run(self.out_names + list(extra), feeds)
        except Exception as e:     # onnxruntime's own exception types: a graph that loads but cannot run
            raise BitNestError(f"the ONNX step graph failed to run ({e.__class__.__name__}: {_first_line(e)}): "
                               "export it again") from None
        self.planes = [tuple(outs[1 + 3 * layer: 4 + 3 * layer]) for layer in range(self.shapes.layers)]
        return outs[0], dict(zip(extra, outs[len(self.out_names):]))


def onnxruntime_engine(ckpt: Checkpoint, capacity: int, onnx_path=None, max_tokens: int = MAX_PASS_TOKENS,
                       session=None) -> StepEngine:
    """A StepEngine over CHECKPOINT/decoder_step.onnx (or `onnx_path`, or an open `session`)."""
    path = Path(onnx_path or ckpt.path / ONNX_FILE)
    if session is None:
        session = open_session(path)
        meta = session.get_modelmeta().custom_metadata_map                # ties the graph to its weights
        if meta.get("bitnest.weights_sha256") != weights_sha256(ckpt.manifest):
            raise BitNestError(f"{path} was exported from other weights than {ckpt.path}: export it again with "
                               f"`python scripts/export.py --out {ckpt.path} --existing --onnx`")
        check_graph_draft_head(meta, ckpt, path)
    runner = OnnxStepRunner(session, StepShapes.of(ckpt.config), capacity, max_tokens)
    return StepEngine(ckpt, runner, "onnxruntime")
