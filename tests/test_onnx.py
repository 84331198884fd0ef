"""ONNX export of the decoder step and its onnxruntime CPU round trip against the torch backend."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch

from tests.conftest import ROOT

# Chosen tolerance: the CPU graph reproduces the torch backend's quantizer inputs bit for bit, so logits
# differ only by float32 rounding in the un-quantized tail (final norm, head): ~1e-6 measured. One flipped
# INT8 or KV code would move them by the quantization noise (~1e-2 .. 1e-1), far above this bound.
MAX_REL_ERR = 1e-3


@pytest.fixture(scope="module")
def rotated_onnx(rotated_checkpoint, tmp_path_factory):
    from export.onnx_export import export_onnx
    return export_onnx(rotated_checkpoint, tmp_path_factory.mktemp("onnx") / "step.onnx")


def test_export_checks_and_stores_each_plane_once(rotated_checkpoint, rotated_onnx):
    from edge.model.checkpoint import load_checkpoint
    ckpt = load_checkpoint(rotated_checkpoint)
    layers = ckpt.config.num_layers
    assert rotated_onnx["nodes"]["DualPlaneGemv"] == 7 * layers
    assert rotated_onnx["nodes"]["NestedKvAttention"] == layers
    assert rotated_onnx["nodes"]["HadamardRows"] == layers and rotated_onnx["nodes"]["RotateRows"] == 1
    model = onnx.load(rotated_onnx["onnx"])
    onnx.checker.check_model(model, full_check=True)
    names = [i.name for i in model.graph.initializer]
    assert len(names) == len(set(names))
    planes = {i.name: i for i in model.graph.initializer if i.name.endswith((".base", ".refine", ".scale"))}
    want = {n: t for n, t in ckpt.tensors.items() if n.endswith((".base", ".refine", ".scale"))}
    assert set(planes) == set(want)
    for name in ("model.layers.3.mlp.down_proj.base", "model.layers.0.self_attn.q_proj.scale"):
        stored = onnx.numpy_helper.to_array(planes[name])                  # planes travel as int32 words
        got = stored.view(np.uint8) if stored.dtype == np.int32 else stored
        assert np.array_equal(got, want[name].numpy()), name
    assert rotated_onnx["file_bytes"] < 1.1 * sum(t.numel() * t.element_size() for t in ckpt.tensors.values())
    kinds = {i.name: i.type.tensor_type.shape for i in model.graph.input}
    assert kinds["input_ids"].dim[0].dim_param == "M" and kinds["kv_base.0"].dim[2].dim_param == "C"


def test_round_trip_matches_torch_rotated_both_views(rotated_checkpoint, rotated_onnx):
    """The real command: a real chat prompt through ONNX and the torch backend, draft and target views."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "verify_onnx.py"), "--checkpoint", str(rotated_checkpoint),
         "--onnx", rotated_onnx["onnx"], "--prompts", "1", "--max-prompt-tokens", "9", "--new-tokens", "2",
         "--modes", "target-kv8,draft-kv4", "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(r["modes"]) == {"target-kv8", "draft-kv4"}
    for mode, m in r["modes"].items():
        assert m["max_rel_err"] < MAX_REL_ERR, (mode, m)
        assert m["passes"] == 4, (mode, m)  # 9 prompt tokens in passes of 5 and 4, then 2 single-token passes
    assert r["nodes"]["DualPlaneGemv"] == 210 and r["nodes"]["NestedKvAttention"] == 30


def test_round_trip_matches_torch_rtn_both_views(rtn_checkpoint, tmp_path):
    from edge.backends.onnxruntime_step import open_session
    from edge.checks.onnx_check import CheckOptions, compare
    from edge.cli.verify_onnx import chat_prompts
    from edge.model.checkpoint import load_checkpoint
    from export.onnx_export import export_onnx

    path = export_onnx(rtn_checkpoint, tmp_path / "step.onnx")["onnx"]
    ckpt = load_checkpoint(rtn_checkpoint)
    prompts = chat_prompts(ckpt, 1, 7)
    r = compare(ckpt, open_session(path), prompts, CheckOptions(new_tokens=1, modes=("target-kv8", "draft-kv8")))
    for mode, m in r["modes"].items():
        assert m["max_rel_err"] < MAX_REL_ERR, (mode, m)


def _single_node_model(op_inputs, shapes, offset: bool):
    from onnx import TensorProto as T
    from onnx import helper as h

    from plugins.contracts import DOMAIN, DOMAIN_VERSION
    from plugins.onnx_schemas import register_schemas
    from plugins.step_contract import IR_VERSION, OPSET
    register_schemas()
    types = [T.FLOAT, T.INT32, T.INT32, T.FLOAT16, T.INT64, T.FLOAT16]
    ins = [h.make_tensor_value_info(n, t, s) for n, t, s in zip(op_inputs, types, shapes)]
    node = h.make_node("DualPlaneGemv", op_inputs, ["y"], domain=DOMAIN, name="gemv")
    graph = h.make_graph([node], "g", ins, [h.make_tensor_value_info("y", T.FLOAT, ["M", shapes[1][0]])])
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", OPSET), h.make_opsetid(DOMAIN, DOMAIN_VERSION)],
                     ir_version=IR_VERSION)
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("view", ["draft", "target"])
def test_gemv_with_offset_matches_reference(view, gen, tmp_path):
    """The top4of8 form (offset input) through onnxruntime against the float64 reference, fresh inputs."""
    from plugins.contracts import view_code
    from plugins.nesting import nest_top4of8
    from plugins.ort_ops import ort_session
    from plugins.packing import pack_nibbles
    from plugins.reference import dual_plane_linear
    from plugins.step_contract import as_words

    n, k, g, m = 96, 192, 64, 5
    codes = nest_top4of8(torch.randn(n, k, generator=gen), g)
    base, refine = pack_nibbles(codes.q4), pack_nibbles(codes.qr)
    x = torch.randn(m, k, generator=gen)
    names = ["x", "base", "refine", "scale", "view", "offset"]
    shapes = [["M", k], [n, k // 8], [n, k // 8], [n, k // g], [1], [n, k // g]]
    path = tmp_path / "gemv.onnx"
    onnx.save(_single_node_model(names, shapes, True), str(path))
    feeds = {"x": x.numpy(), "base": as_words(base.numpy()), "refine": as_words(refine.numpy()), "scale": codes.scale.numpy(),
             "view": np.asarray([view_code(view)], np.int64), "offset": codes.offset.numpy()}
    y = torch.from_numpy(ort_session(path).run(None, feeds)[0])
    ref = dual_plane_linear(x, base, refine, codes.scale, view, codes.offset, act_int8=True)
    err = float((y.double() - ref).norm() / ref.norm())
    assert err < 1e-6, f"{view}: relative error {err}"


def test_verify_onnx_missing_file_is_one_line(rtn_checkpoint, tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "verify_onnx.py"), "--checkpoint", str(rtn_checkpoint),
                          "--onnx", str(tmp_path / "none.onnx")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "does not exist" in out.stderr and "--onnx" in out.stderr


def test_export_engine_refuses_here_with_reason(tmp_path):
    from export.trt_build import engine_build_unavailable
    if engine_build_unavailable() is None:
        pytest.skip("TensorRT and a GPU are present: the engine build runs instead (tests/test_tensorrt.py)")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "export.py"), "--out", str(tmp_path / "ck"),
                          "--engine"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "--engine" in out.stderr
    assert "TensorRT" in out.stderr or "GPU" in out.stderr
    assert not (tmp_path / "ck").exists()  # refused before any export work
