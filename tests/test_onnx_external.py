"""The step graph's external weights, written while the graph is built (export.onnx.external): the same files,
byte for byte, as onnx.save_model writes from the whole graph in memory; the graph held in memory meanwhile carries
references, not weights; and an export that fails part way leaves the previous export as it was."""

import onnx
import pytest

from plugins.step_contract import ONNX_DIGEST_SUFFIX


def test_streamed_weights_are_the_files_onnx_writes_from_memory(small_llama_checkpoint, tmp_path):
    from edge.model.checkpoint import load_checkpoint, set_draft_head
    from edge.model.draft_head import graph_draft_head
    from export.onnx.external import INLINE_BYTES, ExternalData
    from export.onnx.graph import build_step_model, export_onnx, initializer_bytes

    r = export_onnx(small_llama_checkpoint, tmp_path / "streamed" / "step.onnx", external=True)
    assert r["external_data"] and r["initializer_bytes"] > 10 * r["file_bytes"]
    ckpt = load_checkpoint(small_llama_checkpoint)
    ckpt = set_draft_head(ckpt, graph_draft_head(ckpt.draft_head))
    whole = build_step_model(ckpt)                                   # every weight in the graph's own messages
    (tmp_path / "memory").mkdir()
    onnx.save_model(whole, str(tmp_path / "memory" / "step.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="step.onnx.data", size_threshold=1024)
    for name in ("step.onnx", "step.onnx.data"):
        assert (tmp_path / "streamed" / name).read_bytes() == (tmp_path / "memory" / name).read_bytes(), name
    assert initializer_bytes(whole) == r["initializer_bytes"]

    data = ExternalData(tmp_path / "refs.data")
    try:
        refs = build_step_model(ckpt, data)                          # what an external export holds meanwhile
    finally:
        data.close()
    inline = [t for t in refs.graph.initializer if t.data_location != onnx.TensorProto.EXTERNAL]
    assert inline and all(len(t.raw_data) < INLINE_BYTES for t in inline)
    assert sum(len(t.raw_data) for t in refs.graph.initializer) < 0.01 * r["initializer_bytes"]
    assert data.path.stat().st_size == (tmp_path / "memory" / "step.onnx.data").stat().st_size


def test_a_failed_export_leaves_the_previous_one_whole(small_llama_checkpoint, tmp_path, monkeypatch):
    """The weights stream into a staging folder: a failure after some were written (here the TensorRT rule check)
    leaves the earlier graph, its weights and digests untouched and no staging folder behind."""
    import export.trt.readiness as readiness
    from export.onnx.graph import export_onnx
    out = tmp_path / "step.onnx"
    export_onnx(small_llama_checkpoint, out, external=True)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert set(before) == {"step.onnx", "step.onnx.data", "step.onnx" + ONNX_DIGEST_SUFFIX}

    def fail(model):
        raise RuntimeError("planted failure after the weights were streamed")
    monkeypatch.setattr(readiness, "check_graph", fail)
    with pytest.raises(RuntimeError, match="planted"):
        export_onnx(small_llama_checkpoint, out, external=True)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
