"""GGUF files parsed as gguf-py parses them, about three times faster: gguf-py's GGUFReader (0.19) keeps the file as a
`numpy.memmap` and parses each field from many small slices of it; every slice of a memmap runs memmap's Python-level
`__array_finalize__`, so a 151,936-token vocabulary (Qwen2.5's: a string array and 151,387 merges) took ~11 s to
parse here. The reader below holds the same mapping as a plain ndarray view (no copy: the view keeps the memmap as its
base), so the same fields and tensors come back from plain slices. `transformers_reads_fast()` makes transformers'
GGUF loading (which parses the whole file once for a config and once more for a tokenizer) use it too."""

import contextlib
from typing import Iterator

import gguf
import numpy as np


class GGUFReader(gguf.GGUFReader):
    """gguf.GGUFReader whose `data` is the memory map seen as a plain ndarray (fields, tensors and their `data` as
    gguf-py gives them, ndarray views in place of memmap views)."""

    @property
    def data(self) -> np.ndarray:
        return self._data

    @data.setter
    def data(self, value: np.ndarray) -> None:       # gguf-py's __init__ assigns np.memmap(path) here
        self._data = value.view(np.ndarray) if isinstance(value, np.memmap) else value


@contextlib.contextmanager
def transformers_reads_fast() -> Iterator[None]:
    """Within the block, `gguf.GGUFReader` is the reader above: transformers' load_gguf_checkpoint imports it from the
    gguf module when called (transformers 5.x: `from gguf import GGUFReader, dequantize` inside the function), so
    AutoConfig / AutoTokenizer `.from_pretrained(..., gguf_file=...)` parse with it. Restored on exit."""
    before = gguf.GGUFReader
    gguf.GGUFReader = GGUFReader
    try:
        yield
    finally:
        gguf.GGUFReader = before
