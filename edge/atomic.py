"""Atomic file writes: a temporary file in the target folder, flushed to disk, then renamed over the
target, so a reader sees the old file or the whole new one and never a half-written artifact; and the same for a
folder (`staged_folder`)."""

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator


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


@contextmanager
def staged_folder(dest: Path, whole: Callable[[Path], bool]) -> Iterator[Path]:
    """A fresh temporary sibling of folder `dest` to write into, renamed to `dest` when the block ends without an
    error, removed whatever happens. A folder at `dest` that `whole` says is incomplete (left half-written by hand) is
    replaced; where the rename fails because another process put a whole one there first, theirs stays."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        yield tmp
        if dest.exists() and not whole(dest):
            shutil.rmtree(dest, ignore_errors=True)
        try:
            os.replace(tmp, dest)
        except OSError:
            if not whole(dest):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
