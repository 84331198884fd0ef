"""The step graph's external weights written while the graph is built: each initializer's bytes go to the data file
as it is added, and the graph keeps only a reference (ONNX external data: `location`, `offset`, `length`), so the
export's memory stays near the checkpoint's, one linear at a time, instead of several whole copies of the weights (the
initializers, the graph that holds them, the serialized message, the checker's copy). The files are what
onnx.save_model writes with save_as_external_data from the whole graph in memory, byte for byte: tensors back to
back in the order they are added, the same keys, and a tensor onnx would keep in the graph (its raw bytes object
under `size_threshold`, 1024 by default, as sys.getsizeof counts it) kept there."""

import os
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

INLINE_BYTES = 1024    # onnx.save_model's default size_threshold, compared with sys.getsizeof of the raw bytes
_BYTES_OVERHEAD = sys.getsizeof(b"")


class ExternalData:
    """An open data file the graph's initializers stream into (`tensor`); `bytes` written so far."""

    def __init__(self, path: Path):
        self.path, self.location, self.bytes = Path(path), Path(path).name, 0
        self._file = open(self.path, "wb")

    def tensor(self, name: str, array: np.ndarray) -> TensorProto:
        """The initializer `name` of `array`: inline when small, else its bytes appended here and a reference."""
        a = np.ascontiguousarray(array)
        if a.nbytes + _BYTES_OVERHEAD < INLINE_BYTES:
            return numpy_helper.from_array(a, name)
        t = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(a.dtype), dims=a.shape)
        self._file.write(memoryview(a.astype(a.dtype.newbyteorder("<"), copy=False).reshape(-1).view(np.uint8)))
        offset, self.bytes = self.bytes, self.bytes + a.nbytes
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", offset), ("length", a.nbytes)):
            entry = t.external_data.add()
            entry.key, entry.value = key, str(value)
        return t

    def close(self) -> None:
        """Flush the file to disk (it is renamed into place only after the graph referring to it is written)."""
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
