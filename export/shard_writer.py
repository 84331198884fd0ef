"""Safetensors shards written as they are computed: the header is laid out from the tensors' names, dtypes and shapes
before any data, then each tensor's bytes are appended (whole, or a block of rows at a time), hashed on the way, and the
file is put in place by an atomic rename once complete, so a shard on disk is always whole."""

import json
import os
from pathlib import Path

import torch

from edge.errors import BitNestError
from edge.model.manifest import sha256_file

DTYPE_NAMES = {torch.uint8: "U8", torch.int8: "I8", torch.int32: "I32", torch.int64: "I64", torch.float16: "F16",
               torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64"}
ALIGN = 8          # the header is padded with spaces so the data starts 8-byte aligned (the format's recommendation)


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    n = torch.empty((), dtype=dtype).element_size()
    for v in shape:
        n *= v
    return n


def fsync_path(path: Path) -> None:
    """Flush a file's or a folder's entry to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ShardWriter:
    """One safetensors file whose tensors (`entries`: name -> (dtype, shape), laid out in that order) arrive in any
    order, each whole or a block of rows at a time (`write` appends to that tensor's next rows, at its own offset).
    `close()` checks every byte arrived, fsyncs, renames the temporary file into `path` and returns its sha256; a
    failed write (a full disk) removes the temporary file and is a one-line BitNestError. As a context manager, an
    exception before `close()` leaves nothing at `path`."""

    def __init__(self, path: Path, entries: dict[str, tuple[torch.dtype, tuple[int, ...]]]):
        self.path = Path(path)
        self.tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        header, offset = {}, 0
        self.sizes, self.dtypes, self.begin = {}, {}, {}
        for name, (dtype, shape) in entries.items():
            size = _nbytes(dtype, tuple(shape))
            header[name] = {"dtype": DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
            self.sizes[name], self.dtypes[name], self.begin[name] = size, dtype, offset
            offset += size
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-(len(raw) + 8) % ALIGN)
        self.data = 8 + len(raw)
        self.cursor = {name: 0 for name in entries}
        self.fd = None
        self._guard(lambda: self._open(len(raw).to_bytes(8, "little") + raw, self.data + offset))

    def _open(self, head: bytes, size: int) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self._pwrite(head, 0)

    def _pwrite(self, data, at: int) -> None:
        view = memoryview(data).cast("B")
        while len(view):
            k = os.pwrite(self.fd, view, at)
            view, at = view[k:], at + k

    def _guard(self, fn):
        try:
            return fn()
        except OSError as e:
            self.abort()
            raise BitNestError(f"writing {self.path} failed ({e.strerror or e}): free disk space (or choose another "
                               "--out) and run the same command again; the finished layers are kept") from None

    def write(self, name: str, block: torch.Tensor) -> None:
        """Write `block` (the whole tensor `name`, or its next rows) in the dtype the header gave it."""
        if name not in self.sizes:
            raise ValueError(f"shard {self.path.name}: {name} is not one of its tensors")
        if block.dtype != self.dtypes[name]:
            raise ValueError(f"shard {self.path.name}: {name} is {self.dtypes[name]}, got a block of {block.dtype}")
        data = block.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
        if self.cursor[name] + data.nbytes > self.sizes[name]:
            raise ValueError(f"shard {self.path.name}: {name} got more bytes than its shape holds")
        self._guard(lambda: self._pwrite(data, self.data + self.begin[name] + self.cursor[name]))
        self.cursor[name] += data.nbytes

    def close(self) -> str:
        """Finish the file: every tensor whole, fsynced, renamed into place; its sha256."""
        missing = [n for n, c in self.cursor.items() if c != self.sizes[n]]
        if missing:
            self.abort()
            raise ValueError(f"shard {self.path.name}: {missing[0]} is incomplete")

        def finish():
            os.fsync(self.fd)
            os.close(self.fd)
            self.fd = None
            digest = sha256_file(self.tmp)
            os.replace(self.tmp, self.path)
            fsync_path(self.path.parent)
            return digest
        return self._guard(finish)

    def abort(self) -> None:
        """Drop the temporary file (nothing reaches `path`)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.tmp.unlink(missing_ok=True)

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is not None:
            self.abort()


def write_shard(path: Path, tensors: dict[str, torch.Tensor]) -> str:
    """Write whole tensors as one shard at `path` (atomic); its sha256."""
    with ShardWriter(path, {n: (t.dtype, tuple(t.shape)) for n, t in tensors.items()}) as w:
        for name, t in tensors.items():
            w.write(name, t)
        return w.close()
