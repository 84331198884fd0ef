"""TensorRT path: what runs without TensorRT (profile shapes, graph dimensions, refusals) always; the plugin
registration, engine build and engine decode only where TensorRT >= 10.3 and a CUDA GPU exist (`trt`)."""

import pytest

from plugins.step_contract import INPUT_IDS, ProfileSpec, StepShapes, kv_inputs


def test_profile_shapes_cover_every_dynamic_input():
    s = StepShapes(layers=3, kv_heads=2, head_dim=64, vocab=100)
    shapes = ProfileSpec(max_tokens=5, max_context=512, min_context=16, opt_tokens=1, opt_context=256).shapes(s)
    assert shapes[INPUT_IDS] == ((1,), (1,), (5,))
    base, refine, scale = kv_inputs(2)
    assert shapes[base] == shapes[refine] == ((2, 2, 16, 8), (2, 2, 256, 8), (2, 2, 512, 8))   # int32 words
    assert shapes[scale] == ((2, 2, 16), (2, 2, 256), (2, 2, 512))
    assert len(shapes) == 1 + 3 * 3


@pytest.mark.parametrize("kw", [dict(max_tokens=0), dict(opt_tokens=6), dict(max_context=4),
                                dict(min_context=600, max_context=512), dict(opt_context=4096)])
def test_profile_rejects_impossible_ranges(kw):
    with pytest.raises(ValueError):
        ProfileSpec(**kw)


def test_step_shapes_read_from_an_exported_graph(rtn_checkpoint, tmp_path):
    import onnx.inliner

    from edge.model.checkpoint import load_checkpoint
    from export.onnx.graph import build_step_model
    from export.trt.build import step_shapes_of
    ckpt = load_checkpoint(rtn_checkpoint)
    model = build_step_model(ckpt)
    assert step_shapes_of(model) == StepShapes.of(ckpt.config)
    inlined = onnx.inliner.inline_local_functions(model)  # what the engine build hands TensorRT
    assert {n.op_type for n in inlined.graph.node if n.domain == "bitnest"} == {"DualPlaneGemv", "NestedKvAttention"}


def test_refusals_name_the_missing_piece():
    from edge.backends.tensorrt_step import tensorrt_backend_unavailable
    from export.trt.build import engine_build_unavailable
    reason = engine_build_unavailable()
    if reason is None:
        pytest.skip("TensorRT and a CUDA GPU are present here")
    assert "TensorRT" in reason or "GPU" in reason or "plugins.kernels" in reason
    assert "\n" not in reason and tensorrt_backend_unavailable()


def _trt_or_skip():
    from export.trt.build import engine_build_unavailable
    reason = engine_build_unavailable()
    if reason:
        pytest.skip(reason)


PROMPT = [1, 9690, 198, 2683, 359, 253]


@pytest.fixture(scope="module")
def built_engine(small_llama_checkpoint, tmp_path_factory):
    """(checkpoint, engine path) of the 2-layer test model's export (free-running, its logits stay within float32
    rounding of the independent reference: tests/test_methods.py), on a TensorRT machine (skipped elsewhere)."""
    _trt_or_skip()
    from edge.model.checkpoint import load_checkpoint
    from export.onnx.graph import export_onnx
    from export.trt.build import build_engine
    onnx_path = export_onnx(small_llama_checkpoint, tmp_path_factory.mktemp("trt") / "decoder_step.onnx")["onnx"]
    return load_checkpoint(small_llama_checkpoint), \
        build_engine(onnx_path, ProfileSpec(max_tokens=5, max_context=64), kv_binding="aliased")["engine"]


@pytest.mark.trt
def test_engine_build_and_decode_match_reference(built_engine):
    """On a TensorRT machine: decode a few tokens losslessly, and agree with the independent step reference
    (prefill logits and greedy tokens: an engine that computes consistent garbage fails here)."""
    from edge.backends.tensorrt_step import tensorrt_engine
    from edge.checks.reference_agreement import SMALL_MODEL_MAX_REL_ERR, compare_with_reference, reference_run
    from edge.decode.config import GenerateConfig
    from edge.decode.generate import generate
    ckpt, engine = built_engine
    spec, _ = generate(tensorrt_engine(ckpt, 64, engine), PROMPT, GenerateConfig(max_new_tokens=6), set())
    target, _ = generate(tensorrt_engine(ckpt, 64, engine), PROMPT, GenerateConfig(policy="target", max_new_tokens=6),
                         set())
    assert spec == target
    ref = reference_run(ckpt.path, PROMPT, 6, 64)
    r = compare_with_reference(lambda: tensorrt_engine(ckpt, 64, engine), ref, PROMPT, SMALL_MODEL_MAX_REL_ERR)
    assert r["agrees"], r


@pytest.mark.trt
def test_graph_replays_equal_eager_passes(built_engine):
    """Per pass width, a CUDA graph of the context's enqueue replays the same logits as eager enqueues; a width
    whose capture failed says why in one line and runs eagerly."""
    import numpy as np

    from edge.backends.tensorrt_step import tensorrt_engine
    ckpt, engine = built_engine
    eager, graphed = tensorrt_engine(ckpt, 64, engine, graphs=False), tensorrt_engine(ckpt, 64, engine)
    for eng in (eager, graphed):
        eng.prefill(PROMPT)
    for ids, view in (([7], "draft"), ([7], "target"), ([7, 8, 9, 10, 11], "target"), ([12], "draft")):
        a, b = (e.forward(ids, view).numpy() for e in (eager, graphed))
        assert np.array_equal(a, b), (ids, view)
        for e in (eager, graphed):
            e.commit(e.length + len(ids))
    summary = graphed.runner.passes.summary()
    print("tensorrt graphs", summary)
    assert sorted(summary["graphs"]) + sorted(summary["eager"]) == [1, 5]
    assert all("\n" not in r for r in summary["eager"].values())


def test_tensorrt_engine_refuses_here(rtn_checkpoint):
    from edge.backends.tensorrt_step import (
        tensorrt_backend_unavailable,
        tensorrt_engine,
    )
    from edge.errors import BitNestError
    from edge.model.checkpoint import load_checkpoint
    if tensorrt_backend_unavailable() is None:
        pytest.skip("TensorRT and a GPU are present here")
    with pytest.raises(BitNestError, match="tensorrt backend: ") as e:
        tensorrt_engine(load_checkpoint(rtn_checkpoint, verify=False), 64)
    assert "\n" not in str(e.value)


def test_runtime_tensorrt_backend_refuses_here(rtn_checkpoint):
    from edge.backends.tensorrt_step import tensorrt_backend_unavailable
    from edge.errors import BitNestError
    from edge.llm import Runtime
    if tensorrt_backend_unavailable() is None:
        pytest.skip("TensorRT and a GPU are present here")
    with pytest.raises(BitNestError, match="tensorrt backend: ") as e:
        Runtime(rtn_checkpoint, backend="tensorrt", max_context=64)
    assert "\n" not in str(e.value)


def test_the_parser_gets_an_inlined_copy_that_reads_the_original_weights(small_llama_checkpoint, tmp_path):
    """What build_engine hands parse_from_file, checked here: standard ops and plugin nodes only, its external
    weights the original file's (never a second copy, never a 2 GiB protobuf message), removed afterwards."""
    import onnx

    from export.onnx.graph import export_onnx
    from export.trt.build import inlined_copy
    path = export_onnx(small_llama_checkpoint, tmp_path / "decoder_step.onnx", external=True)["onnx"]
    with inlined_copy(path) as copy:
        assert copy.parent == tmp_path and copy.stat().st_size < 1 << 20
        model = onnx.load(str(copy))                              # external data resolved beside the original
        assert not model.functions and {n.domain for n in model.graph.node} <= {"", "bitnest"}
        assert {n.op_type for n in model.graph.node if n.domain == "bitnest"} == {"DualPlaneGemv", "NestedKvAttention"}
        onnx.checker.check_model(str(copy), full_check=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decoder_step.onnx", "decoder_step.onnx.data",
                                                          "decoder_step.onnx.sha256"]   # the export's digests


@pytest.mark.trt
def test_pingpong_engine_equals_the_aliased_engine(built_engine, tmp_path):
    """On a TensorRT machine: the engine built for ping-pong KV binding (separate plane buffers swapped each pass)
    gives the aliased engine's logits pass for pass, eager and replayed; the build records say which binding each
    has and what plane copies TensorRT's verbose build log showed."""
    import json
    from pathlib import Path

    import numpy as np

    from edge.backends.tensorrt_record import record_path
    from edge.backends.tensorrt_step import tensorrt_engine
    from export.trt.build import build_engine
    ckpt, engine = built_engine
    print("aliased build record", json.loads(record_path(engine).read_text()))
    pp = build_engine(Path(engine).with_name("decoder_step.onnx"), ProfileSpec(max_tokens=5, max_context=64),
                      out=tmp_path / "pingpong.engine", kv_binding="pingpong")
    print("ping-pong build record", {k: pp[k] for k in ("kv_binding", "plane_copies", "log_plane_copies", "kv_window")})
    assert pp["kv_binding"] == "pingpong" and pp["plane_copies"] == [] and pp["kv_window"] == [5]
    for graphs in (False, True):
        engines = [tensorrt_engine(ckpt, 64, e, graphs=graphs) for e in (engine, pp["engine"])]
        assert engines[1].runner.kv_binding == "pingpong"
        for e in engines:
            e.prefill(PROMPT)
        for ids, view in (([7], "draft"), ([8], "draft"), ([7, 8, 9, 10, 11], "target"), ([12], "draft")):
            a, b = (e.forward(ids, view).numpy() for e in engines)
            assert np.array_equal(a, b), (graphs, ids, view)
            for e in engines:
                e.commit(e.length + (1 if view == "draft" and len(ids) == 1 else 2))
