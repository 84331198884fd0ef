"""Gate thresholds beside a checkpoint (Precision on Demand §3.2): the small JSON file of entropy and margin
thresholds calibrated per backend for escalation rates 3, 7, 15 and 30%, tied to the weights' hash (atomic
write), and the lookup that fills a gate's threshold from its rate. Calibration itself is analysis code
(edge.analysis.calibrate, `bitnest calibrate`): the runtime never calibrates."""

import json
import math
from dataclasses import replace
from pathlib import Path

from edge.atomic import write_atomic
from edge.decode.config import GateConfig
from edge.decode.registry import policy_class
from edge.errors import BitNestError
from edge.model.checkpoint import Checkpoint
from edge.model.manifest import weights_sha256
from edge.model.draft_head import DRAFT_HEAD_UNRECORDED

RATES = (0.03, 0.07, 0.15, 0.30)
THRESHOLDS_FILE = "gate_thresholds.json"
FORMAT = "bitnest-gate-thresholds"


def rate_key(rate: float) -> str:
    return f"{rate:g}"


def _weights_hash(ckpt: Checkpoint) -> str:
    return weights_sha256(ckpt.manifest)


def read_thresholds(ckpt: Checkpoint) -> dict:
    """The thresholds file beside the checkpoint ({} if absent); entries of another export are dropped."""
    path = ckpt.path / THRESHOLDS_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        raise BitNestError(f"{path} is not valid JSON: delete it and calibrate again") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("weights_sha256") != _weights_hash(ckpt):
        return {}
    backends = data.get("backends", {})
    if not isinstance(backends, dict) or not all(isinstance(e, dict) for e in backends.values()):
        raise BitNestError(f"{path} is malformed (backends): delete it and calibrate again")
    return backends


def recorded_draft_head(ckpt: Checkpoint):
    """The draft head the manifest records (what an entry without a `draft_head` was calibrated with)."""
    return ckpt.manifest.get("draft_head", DRAFT_HEAD_UNRECORDED) if ckpt.head_nested else None


def thresholds_entry(ckpt: Checkpoint, backend: str) -> dict | None:
    """The backend's calibrated entry where it was calibrated with the draft head `ckpt` runs now (the draft's
    logits, hence its entropy and margin, depend on it), else None."""
    entry = read_thresholds(ckpt).get(backend)
    if entry is None or entry.get("draft_head", recorded_draft_head(ckpt)) != ckpt.draft_head:
        return None
    return entry


def save_thresholds(ckpt: Checkpoint, entry: dict) -> Path:
    """Merge one backend's entry into the file beside the checkpoint, atomically (temp file + rename)."""
    backends = read_thresholds(ckpt)
    backends[entry["backend"]] = entry
    data = {"format": FORMAT, "version": 1, "weights_sha256": _weights_hash(ckpt), "backends": backends}
    path = ckpt.path / THRESHOLDS_FILE
    try:
        write_atomic(json.dumps(data, indent=1).encode(), path)
    except OSError as e:
        raise BitNestError(f"cannot write gate thresholds beside {ckpt.path} ({e.strerror}): "
                           "make the folder writable or pass --gate-threshold") from None
    return path


def resolve_gate(ckpt: Checkpoint, backend: str, policy: str, gate: GateConfig) -> GateConfig:
    """`gate` with the threshold of its rate filled in from the thresholds file (threshold gates only); a gate
    with no calibrated threshold is a one-line error that says how to calibrate."""
    cls = policy_class(policy)
    if not cls.needs_threshold or gate.threshold is not None:
        return gate
    entry = thresholds_entry(ckpt, backend)
    if entry is None:
        head = f" --draft-head {ckpt.draft_head}" if ckpt.draft_head != recorded_draft_head(ckpt) else ""
        raise BitNestError(f"{policy} needs a threshold and {ckpt.path} has none calibrated for the {backend} "
                           f"backend{' and draft head ' + ckpt.draft_head if head else ''}: run `bitnest calibrate "
                           f"--checkpoint {ckpt.path} --backend {backend}{head}` (about a minute), or pass "
                           "--gate-threshold")
    table = entry.get(cls.signal_of(gate))
    if not isinstance(table, dict):
        raise BitNestError(f"{ckpt.path / THRESHOLDS_FILE} holds no {cls.signal_of(gate)} thresholds for the "
                           f"{backend} backend: calibrate again")
    key = rate_key(gate.rate)
    if key not in table:
        raise BitNestError(f"no threshold calibrated for rate {key}: use one of {', '.join(map(str, table))} "
                           "or pass --gate-threshold")
    value = table[key]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise BitNestError(f"{ckpt.path / THRESHOLDS_FILE}: threshold {value!r} for rate {key} is not a number: "
                           "calibrate again")
    return replace(gate, threshold=float(value))
