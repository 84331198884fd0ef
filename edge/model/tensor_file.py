"""Named tensors of a safetensors file read by byte range: the header is parsed and checked, then each tensor asked
for is read with one positioned read into its own buffer and nothing else is read, so what a loader leaves out never
leaves the disk (`--weights base` leaves out the refinement planes; docs/contracts.md, weights: loading the base
planes only)."""

import json
import os
from pathlib import Path

import torch

from edge.errors import CheckpointError

HEADER_BYTES = 8          # little-endian u64: the JSON header's length
MAX_HEADER = 100 << 20    # the safetensors library's own limit
DTYPES = {"U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
          "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64,
          "BOOL": torch.bool}


def read_header(f, path: Path) -> tuple[dict[str, tuple[torch.dtype, tuple[int, ...], int, int]], int]:
    """{name: (dtype, shape, begin, end)} with absolute file offsets, and the file's size; CheckpointError (one line)
    where the header is malformed or a tensor's bytes lie outside the file or disagree with its shape."""
    bad = lambda why: CheckpointError(f"{path} has a malformed safetensors header ({why}): re-export the checkpoint")
    size = os.fstat(f.fileno()).st_size
    raw = os.pread(f.fileno(), HEADER_BYTES, 0)
    if len(raw) < HEADER_BYTES:
        raise bad("shorter than its length field")
    n = int.from_bytes(raw, "little")
    if n > min(MAX_HEADER, size - HEADER_BYTES):
        raise bad(f"header length {n} past the file's {size} bytes")
    try:
        head = json.loads(os.pread(f.fileno(), n, HEADER_BYTES))
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


def read_tensors(path: Path, wanted) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    """The tensors of file `path` that `wanted(name)` accepts (each read alone into its own buffer), and the byte
    size of every tensor left unread (name -> bytes)."""
    with open(path, "rb", buffering=0) as f:
        entries, _ = read_header(f, path)
        tensors, skipped = {}, {}
        for name, (dtype, shape, begin, end) in entries.items():
            if not wanted(name):
                skipped[name] = end - begin
                continue
            buf = torch.empty(end - begin, dtype=torch.uint8)                    # [bytes]
            view, got = memoryview(buf.numpy()), 0
            while got < len(view):
                k = os.preadv(f.fileno(), [view[got:]], begin + got)
                if k <= 0:
                    raise CheckpointError(f"{path} ends inside tensor {name}: re-export the checkpoint")
                got += k
            tensors[name] = buf.view(dtype).reshape(shape) if end > begin else torch.empty(shape, dtype=dtype)
    return tensors, skipped
