"""Named tensors of a safetensors file read by byte range: the header is parsed and checked, then each tensor asked
for is read with one positioned read into its own buffer and nothing else is read, so what a loader leaves out never
leaves the disk (`--weights base` leaves out the refinement planes; docs/contracts.md, weights: loading the base
planes only)."""

import hashlib
import json
import os
from pathlib import Path
from typing import Optional

import torch

from edge.errors import CheckpointError

HEADER_BYTES = 8          # little-endian u64: the JSON header's length
MAX_HEADER = 100 << 20    # the safetensors library's own limit
DTYPES = {"U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
          "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
          "BOOL": torch.bool}


def sha256_mismatch(path: Path) -> CheckpointError:
    """The one line for a checkpoint file whose bytes are not the ones its manifest seals."""
    return CheckpointError(f"checkpoint {path.parent}: {path.name} fails its sha256 check (changed or truncated): "
                           "re-export it")


def read_header(f, path: Path, digest=None) -> tuple[dict[str, tuple[torch.dtype, tuple[int, ...], int, int]], int]:
    """{name: (dtype, shape, begin, end)} with absolute file offsets, and the file's size; CheckpointError (one line)
    where the header is malformed or a tensor's bytes lie outside the file or disagree with its shape. The bytes it
    read (length field and header) go through `digest` where one is given."""
    bad = lambda why: CheckpointError(f"{path} has a malformed safetensors header ({why}): re-export the checkpoint")
    size = os.fstat(f.fileno()).st_size
    raw = os.pread(f.fileno(), HEADER_BYTES, 0)
    if len(raw) < HEADER_BYTES:
        raise bad("shorter than its length field")
    n = int.from_bytes(raw, "little")
    if n > min(MAX_HEADER, size - HEADER_BYTES):
        raise bad(f"header length {n} past the file's {size} bytes")
    text = os.pread(f.fileno(), n, HEADER_BYTES)
    if digest is not None:
        digest.update(raw)
        digest.update(text)
    try:
        head = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        raise bad("not JSON") from None
    if not isinstance(head, dict):
        raise bad("not an object")
    data, out = HEADER_BYTES + n, {}
    for name, e in head.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (b, e_) = DTYPES[e["dtype"]], tuple(int(v) for v in e["shape"]), e["data_offsets"]
            ok = isinstance(b, int) and isinstance(e_, int) and all(v >= 0 for v in shape) and 0 <= b <= e_
        except (KeyError, TypeError, ValueError):
            raise bad(f"entry {name[:60]!r}") from None
        count = 1
        for v in shape:
            count *= v
        if not ok or e_ - b != count * torch.empty(0, dtype=dtype).element_size() or data + e_ > size:
            raise bad(f"tensor {name[:60]!r}: offsets {b}..{e_} do not fit its shape or the file")
        out[name] = (dtype, shape, data + b, data + e_)
    return out, size


class _Counted:
    """A sha256 that counts the bytes it has taken (the file offset a sequential digest has reached)."""

    def __init__(self):
        self.h, self.length = hashlib.sha256(), 0

    def update(self, data) -> None:
        self.h.update(data)
        self.length += len(data)

    def hexdigest(self) -> str:
        return self.h.hexdigest()


def _pread_into(fd: int, view: memoryview, at: int, path: Path, what: str) -> None:
    """Fill `view` from offset `at` of file `fd` by positioned reads (one-line CheckpointError where the file ends)."""
    got = 0
    while got < len(view):
        k = os.preadv(fd, [view[got:]], at + got)
        if k <= 0:
            raise CheckpointError(f"{path} ends inside {what}: re-export the checkpoint")
        got += k


def read_tensors(path: Path, wanted, sha256: Optional[str] = None) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """The tensors of file `path` that `wanted(name)` accepts (each read alone into its own buffer), and the byte
    size of every tensor left unread (name -> bytes). With `sha256` (the file's expected hex digest) every tensor must
    be wanted: the file is read once, in order, and every byte of it (header, tensors, any gap) goes through the
    digest as it is read, so a verified load reads each byte once rather than hashing the file first."""
    digest = _Counted() if sha256 is not None else None
    with open(path, "rb", buffering=0) as f:
        try:
            entries, size = read_header(f, path, digest)
        except CheckpointError:
            if digest is not None:                    # a file that is not what was exported: say that first
                raise sha256_mismatch(path) from None
            raise
        tensors, skipped = {}, {}

        def hash_to(end: int) -> None:                 # the bytes the digest has not taken before `end` (gaps, tail)
            while digest.length < end:
                chunk = bytearray(min(end - digest.length, 1 << 20))
                _pread_into(f.fileno(), memoryview(chunk), digest.length, path, "the bytes between its tensors")
                digest.update(chunk)

        for name, (dtype, shape, begin, end) in sorted(entries.items(), key=lambda kv: kv[1][2]):
            if not wanted(name):
                if digest is not None:
                    raise ValueError("a verified read reads every tensor")
                skipped[name] = end - begin
                continue
            buf = torch.empty(end - begin, dtype=torch.uint8)                    # [bytes]
            view = memoryview(buf.numpy())
            if digest is not None:
                if begin < digest.length:
                    raise CheckpointError(f"{path}: tensor {name[:60]!r} overlaps another: re-export the checkpoint")
                hash_to(begin)
            _pread_into(f.fileno(), view, begin, path, f"tensor {name}")
            if digest is not None:
                digest.update(view)
            tensors[name] = buf.view(dtype).reshape(shape) if end > begin else torch.empty(shape, dtype=dtype)
        if digest is not None:
            hash_to(size)
            if digest.hexdigest() != sha256:
                raise sha256_mismatch(path)
    return tensors, skipped
