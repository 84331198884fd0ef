"""edge.model.gguf_file's reader against gguf-py's own, field by field and tensor by tensor, on the default model's
real GGUF; and its hook into transformers scoped to its block."""

import gguf
import numpy as np

from edge.model.gguf_file import GGUFReader, transformers_reads_fast
from export.source_spec import default_gguf


def test_the_fast_reader_reads_what_gguf_py_reads():
    path = str(default_gguf())
    ref, fast = gguf.GGUFReader(path), GGUFReader(path)
    assert list(fast.fields) == list(ref.fields) and len(ref.fields) > 20
    for name, want in ref.fields.items():
        got = fast.fields[name]
        assert (got.offset, got.name, got.types, got.data) == (want.offset, want.name, want.types, want.data), name
        assert len(got.parts) == len(want.parts), name
        for a, b in zip(got.parts, want.parts):
            assert a.dtype == b.dtype and np.array_equal(a, b), name
    vocab = fast.fields["tokenizer.ggml.tokens"]
    assert len(vocab.data) == 49152 and vocab.contents()[:3] == ref.fields["tokenizer.ggml.tokens"].contents()[:3]
    assert [t.name for t in fast.tensors] == [t.name for t in ref.tensors] and len(ref.tensors) == 272
    for got, want in zip(fast.tensors, ref.tensors):
        assert (got.tensor_type, got.data_offset, got.n_bytes) == (want.tensor_type, want.data_offset, want.n_bytes)
        assert got.shape.tolist() == want.shape.tolist() and np.array_equal(got.data, want.data), got.name
    assert not isinstance(fast.data, np.memmap) and isinstance(ref.data, np.memmap)     # what makes it fast
    assert np.shares_memory(fast.data, fast.tensors[0].data)                             # no copy of the file


def test_transformers_reads_fast_only_inside_its_block():
    before = gguf.GGUFReader
    with transformers_reads_fast():
        from gguf import GGUFReader as inside             # as transformers' load_gguf_checkpoint imports it
        assert inside is GGUFReader
    assert gguf.GGUFReader is before is not GGUFReader
    try:
        with transformers_reads_fast():
            raise KeyError("x")
    except KeyError:
        pass
    assert gguf.GGUFReader is before
