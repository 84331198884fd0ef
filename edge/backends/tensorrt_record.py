"""The record an engine build writes beside the engine (`decoder_step.engine.json`): the TensorRT version that built
it, the KV binding it was built for (edge.backends.tensorrt_kv), the plane copies its verbose build log showed, and
the profile. The tensorrt backend reads it before deserializing: an engine of another TensorRT version is refused
in one line naming the rebuild (a serialized engine runs only on the TensorRT version that built it)."""

import json
from pathlib import Path

from edge.backends.tensorrt_kv import ALIASED, KV_BINDINGS
from edge.errors import BitNestError

REBUILD = "rebuild it with `python scripts/export.py --out CKPT --existing --engine`"


def record_path(engine) -> Path:
    return Path(str(engine) + ".json")


def read_record(engine) -> dict:
    """The build record beside `engine` ({} where there is none: an engine built before records, aliased KV)."""
    path = record_path(engine)
    if not path.is_file():
        return {}
    try:
        record = json.loads(path.read_text())
    except ValueError:
        raise BitNestError(f"{path} is not a JSON engine record: {REBUILD}") from None
    if not isinstance(record, dict) or record.get("kv_binding", ALIASED) not in KV_BINDINGS:
        raise BitNestError(f"{path} names no known KV binding ({', '.join(KV_BINDINGS)}): {REBUILD}")
    return record


def check_version(record: dict, engine, tensorrt_version: str) -> None:
    """BitNestError, one line, where the record says another TensorRT version built `engine`."""
    built = record.get("tensorrt")
    if built is not None and built != tensorrt_version:
        raise BitNestError(f"engine {engine} was built by TensorRT {built}, this is TensorRT {tensorrt_version} "
                           f"(an engine runs only on the version that built it): {REBUILD}")
