"""Counting tensor memory: bytes of the distinct storages an object graph holds, and the peak of live
storage bytes that the ops run under a tracer allocate (works on real and on meta tensors)."""

from typing import Any, Iterable

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _key(storage) -> int:
    return storage._cdata                      # one key per storage, also on the meta device (no data_ptr)


def tensors_in(obj: Any, _seen: set | None = None) -> Iterable[torch.Tensor]:
    """Every tensor reachable from `obj` through dicts, lists, tuples and object attributes."""
    seen = set() if _seen is None else _seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors_in(v, seen)
    elif isinstance(obj, (list, tuple, set)):
        for v in obj:
            yield from tensors_in(v, seen)
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        for v in vars(obj).values():
            yield from tensors_in(v, seen)


def storage_bytes(*objs: Any) -> int:
    """Bytes of the distinct storages held by `objs` (views and shared tensors counted once)."""
    seen, total = set(), 0
    for obj in objs:
        for t in tensors_in(obj):
            s = t.untyped_storage()
            k = _key(s)
            if k not in seen:
                seen.add(k)
                total += s.nbytes()
    return total


class AllocationTracer(TorchDispatchMode):
    """Tracks the storages that ops allocate while the mode is active: `live` bytes now and their `peak`.

    A storage counts from the op that creates it until it is freed (checked before each op, so the
    inputs an op frees count at its own peak, as they do for the allocator). Buffers a native kernel
    allocates internally and frees before returning are not seen; on the CPU paths of this runtime the
    SDPA math path and the int4 GEMM expose theirs as ops.
    """

    def __init__(self):
        super().__init__()
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.current = 0
        self.peak = 0

    def _sweep(self) -> None:
        for k, (ref, n) in list(self.live.items()):
            if ref.expired():
                del self.live[k]
                self.current -= n

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._sweep()
        known = {_key(t.untyped_storage()) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                k = _key(s)
                if k not in known and k not in self.live:
                    self.live[k] = (StorageWeakRef(s), s.nbytes())
                    self.current += s.nbytes()
        self.peak = max(self.peak, self.current)
        return out
