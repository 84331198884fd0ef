"""Atomic file writes: a temporary file in the target folder, flushed to disk, then renamed over the
target, so a reader sees the old file or the whole new one and never a half-written artifact."""

import os
import tempfile
from pathlib import Path


def write_atomic(data: bytes, out: Path) -> None:
    """Write `data` to `out` atomically; OSError (e.g. a read-only folder) leaves `out` untouched."""
    out = Path(out)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
