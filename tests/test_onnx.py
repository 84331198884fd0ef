"""ONNX export of the decoder step, checked independently: the graph runs in onnxruntime with its local functions
inlined to onnxruntime's standard kernels (what TensorRT runs) and only the two BitNest ops as Python ops, against
a float64 numpy reference that shares no code with those ops (edge.checks.step_reference), layer by layer on the
graph's own inputs (edge.checks.onnx_check explains why free-running comparison cannot be tight)."""

import ast
import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch

from tests.conftest import ROOT

# Chosen tolerances. Embedding and logits (the float tail after the last layer, on the graph's own residual): float32
# rounding only, ~1e-6 measured. A layer's output against the reference on the same input, relative to the layer's
# own contribution: ~2e-7 typical (median), but a flipped INT8 activation or KV code (one ulp before a quantizer,
# float32 against float64) moves one layer by up to ~2e-2 (measured max on the 135M model), so the median is held
# tight and the maximum at 0.1; a wrong op body is an error of order one in every layer.
MAX_REL_ERR = 1e-5
LAYER_MEDIAN = 1e-5
LAYER_MAX = 0.1
FLIP_RATE = 1e-3


def assert_checked(m: dict, name=""):
    assert m["max_rel_err"] < MAX_REL_ERR and m["layer_err_median"] < LAYER_MEDIAN, (name, m)
    assert m["layer_err_max"] < LAYER_MAX and m["kv_code_flip_rate"] < FLIP_RATE, (name, m)
    assert m["argmax_agreement"] == 1.0, (name, m)


@pytest.fixture(scope="module")
def rotated_onnx(rotated_checkpoint, tmp_path_factory):
    from export.onnx.graph import export_onnx
    return export_onnx(rotated_checkpoint, tmp_path_factory.mktemp("onnx") / "step.onnx")


def test_export_checks_and_stores_each_plane_once(rotated_checkpoint, rotated_onnx):
    from edge.model.checkpoint import load_checkpoint
    ckpt = load_checkpoint(rotated_checkpoint)
    layers = ckpt.config.num_layers
    assert rotated_onnx["nodes"]["DualPlaneGemv"] == 7 * layers + 1                    # and the nested head
    assert rotated_onnx["nodes"]["NestedKvAttention"] == layers
    assert rotated_onnx["nodes"]["HadamardRows"] == layers and rotated_onnx["nodes"]["RotateRows"] == 1
    model = onnx.load(rotated_onnx["onnx"])
    onnx.checker.check_model(model, full_check=True)
    names = [i.name for i in model.graph.initializer]
    assert len(names) == len(set(names))
    planes = {i.name: i for i in model.graph.initializer if i.name.endswith((".base", ".refine", ".scale"))}
    want = {n: t for n, t in ckpt.tensors.items() if n.endswith((".base", ".refine", ".scale"))}
    assert set(planes) == set(want)
    # every linear of the model tiles: its planes travel warp-tiled (int32 words [N/32, K/G, G/32, 32, 4], scales
    # [N/32, K/G, 32]), and their canonical rows are the checkpoint's planes, byte for byte
    assert all(len(i.dims) == (5 if i.name.endswith(("base", "refine")) else 3) for i in planes.values())
    from plugins.kernels.tiling import TiledPlanes
    for linear in ("model.layers.3.mlp.down_proj", "model.layers.0.self_attn.q_proj", "lm_head"):
        stored = [torch.from_numpy(onnx.numpy_helper.to_array(planes[linear + s]).copy())
                  for s in (".base", ".refine", ".scale")]
        rows = TiledPlanes.from_words(*stored).canonical()
        for got, s in zip(rows, (".base", ".refine", ".scale")):
            assert torch.equal(got, want[linear + s]), linear + s
    assert rotated_onnx["file_bytes"] < 1.1 * sum(t.numel() * t.element_size() for t in ckpt.tensors.values())
    kinds = {i.name: i.type.tensor_type.shape for i in model.graph.input}
    assert kinds["input_ids"].dim[0].dim_param == "M" and kinds["kv_base.0"].dim[2].dim_param == "C"


def test_graph_matches_the_independent_reference_rotated_both_views(rotated_checkpoint, rotated_onnx):
    """The real command on the default model (R1, R2, R4): a real chat prompt, target and draft views."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "verify_onnx.py"), "--checkpoint", str(rotated_checkpoint),
         "--onnx", rotated_onnx["onnx"], "--prompts", "1", "--max-prompt-tokens", "5", "--new-tokens", "1",
         "--modes", "target-kv8,draft-kv4", "--json"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(r["modes"]) == {"target-kv8", "draft-kv4"}
    for mode, m in r["modes"].items():
        assert_checked(m, mode)
        assert m["passes"] == 2, (mode, m)  # 5 prompt tokens in one pass (γ+1), then one single-token pass
    assert r["nodes"]["DualPlaneGemv"] == 211 and r["nodes"]["NestedKvAttention"] == 30
    assert r["draft_head"] == "8bit"                  # the draft-kv4 mode read the head at 8 bits, as the graph does


def test_graph_embedding_is_the_head_target_view(rotated_checkpoint, rotated_onnx):
    """The default export's graph gathers its embedding rows from the nested head's int32-word planes (no float16
    copy in the graph): the residual stream entering layer 0 equals the torch backend's embedding (target-view rows,
    then R1) bit for bit in the session whose functions run the torch backend's math. Rows gathered from the base
    plane alone, or nibbles unpacked in the wrong order or sign, differ at once."""
    from edge.backends.onnxruntime_step import OnnxStepRunner
    from edge.backends.torch_ref import TorchBackend
    from edge.model.checkpoint import load_checkpoint
    from edge.model.decoder import Decoder
    from plugins.onnx.ort_ops import ort_session
    from plugins.step_contract import EMBEDDED, StepShapes
    ckpt = load_checkpoint(rotated_checkpoint)
    assert ckpt.embedding_from_head
    model = onnx.load(rotated_onnx["onnx"], load_external_data=False)
    assert "model.embed_tokens.weight" not in {i.name for i in model.graph.initializer}
    ids = [0, 1, 504, 3145, 49151, 3145, 7]
    runner = OnnxStepRunner(ort_session(rotated_onnx["onnx"], expose=(EMBEDDED,)), StepShapes.of(ckpt.config), 16)
    got = runner.run(ids, "draft", len(ids), 0, (EMBEDDED,))[1][EMBEDDED]
    want = Decoder(ckpt.config, TorchBackend(ckpt), ckpt.rotations).embed(torch.tensor(ids))
    assert torch.equal(torch.from_numpy(got), want)


# The onnxruntime engine against the torch backend (PassEngine) on the nested-head export, whole model, both views.
# The graph's functions run the torch backend's own float math, but its standard ops (RoPE, residual adds, the R1
# inverse MatMul) are onnxruntime's kernels: one ulp before an INT8 quantizer can flip one code somewhere, which moves
# logits by ~1e-3 relative; a head read at the wrong view (4 bits for the 8bit draft) moves them by ~0.1 or more.
ROUND_TRIP_REL_ERR = 2e-2


def test_graph_round_trips_both_views_against_the_torch_backend(rotated_checkpoint, rotated_onnx):
    from edge.backends.onnxruntime_step import onnxruntime_engine
    from edge.backends.torch_ref import TorchBackend
    from edge.engine.interface import PassEngine
    from edge.model.checkpoint import load_checkpoint
    ckpt = load_checkpoint(rotated_checkpoint)
    assert ckpt.draft_head == "8bit"
    ort = onnxruntime_engine(ckpt, 32, rotated_onnx["onnx"])
    ref = PassEngine(ckpt, TorchBackend(ckpt), 32)
    prompt = [1, 504, 3145, 282, 260, 3622]
    for view in ("target", "draft"):
        for eng in (ort, ref):
            eng.reset()
            eng.prefill(prompt)
        got, want = ort.forward([30, 5000], view), ref.forward([30, 5000], view)            # [2, V]
        err = float((got - want).norm() / want.norm())
        assert err < ROUND_TRIP_REL_ERR and torch.equal(got.argmax(-1), want.argmax(-1)), (view, err)


def test_graph_refuses_the_shortlist_and_a_different_setting(rotated_checkpoint, rotated_onnx, tmp_path):
    """The step graph serves 8bit (the default) or 4bit; the shortlist asked for is refused in one line naming the
    fix, and a runtime set to another draft head than its graph's is refused too."""
    from edge.backends.onnxruntime_step import onnxruntime_engine
    from edge.errors import BitNestError
    from edge.model.checkpoint import load_checkpoint, set_draft_head
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "export.py"), "--out", str(rotated_checkpoint),
                          "--existing", "--onnx", "--draft-head", "shortlist"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--draft-head 8bit" in out.stderr, out.stderr
    with pytest.raises(BitNestError, match="serves draft head 8bit and the checkpoint is set to 4bit"):
        onnxruntime_engine(set_draft_head(load_checkpoint(rotated_checkpoint), "4bit"), 16, rotated_onnx["onnx"])
    with pytest.raises(BitNestError, match="set to shortlist: pass --draft-head 8bit, or use the native backend$"):
        onnxruntime_engine(set_draft_head(load_checkpoint(rotated_checkpoint), "shortlist"), 16, rotated_onnx["onnx"])
    with pytest.raises(BitNestError, match="scores the whole vocabulary .* 4096 ids only: pass --draft-vocab 49152"):
        onnxruntime_engine(set_draft_head(load_checkpoint(rotated_checkpoint), draft_vocab=4096), 16,
                           rotated_onnx["onnx"])


def test_a_checkpoint_recording_the_shortlist_runs_its_graph_at_8_bits(rotated_checkpoint, tmp_path):
    """A checkpoint whose manifest records the shortlist and a draft vocabulary (as a model's own-files export or the
    Qwen preset does): its graph, exported with no draft-head option, serves the 8-bit head, and the onnxruntime
    backend runs the checkpoint with no option at what the graph serves (the 8-bit head over every id, in the stats
    and the byte accounting), lossless; the native backend still runs the recorded shortlist."""
    from edge.decode.config import GenerateConfig
    from edge.engine.stats import weight_bytes_per_pass
    from edge.model.checkpoint import load_checkpoint, set_draft_head
    from edge.llm import Runtime
    from export.onnx.graph import export_onnx
    from tests.conftest import manifest_copy
    ck = manifest_copy(rotated_checkpoint, tmp_path / "shortlist",
                       lambda m: m.update(draft_head="shortlist", draft_vocab=16384))
    meta = {p.key: p.value for p in onnx.load(export_onnx(ck)["onnx"], load_external_data=False).metadata_props}
    assert meta["bitnest.draft_head"] == "8bit"
    rt = Runtime(ck, backend="onnxruntime", max_context=128)
    assert (rt.ckpt.draft_head, rt.ckpt.draft_vocab) == ("8bit", None)
    eight = set_draft_head(load_checkpoint(rotated_checkpoint), "8bit")
    assert rt.engine.pass_weight_bytes["draft"] == weight_bytes_per_pass(eight, "draft", tokens=0)
    ids = rt.encode("Name a river.")
    spec = rt.generate(ids, GenerateConfig(max_new_tokens=4, gamma=1))      # 3 tokens past the prefill's: 2+ rounds
    target = rt.generate(ids, GenerateConfig(max_new_tokens=4, policy="target"))
    assert spec["tokens"] == target["tokens"] and spec["stats"].summary()["draft_head"] == "8bit"
    native = load_checkpoint(ck)
    assert (native.draft_head, native.draft_vocab) == ("shortlist", 16384)
    # the independent reference reads it as the graph does (a target-only check of its graph or engine runs on it)
    from edge.checks.step_reference import StepReference
    ids = [1, 504, 3145, 282]
    got, want = (StepReference(c, 16).step(ids, "draft", len(ids), 0) for c in (ck, rotated_checkpoint))
    assert np.array_equal(got, want)


def small_onnx(checkpoint, tmp_path):
    from export.onnx.graph import export_onnx
    return export_onnx(checkpoint, tmp_path / "step.onnx")["onnx"]


def check(checkpoint, path, modes=("target-kv8", "draft-kv4"), tokens=(1, 504, 3145, 282, 260, 3622, 30)):
    from edge.checks.onnx_check import CheckOptions, check_session, compare
    from edge.model.checkpoint import load_checkpoint
    ckpt = load_checkpoint(checkpoint)
    return compare(ckpt, check_session(path, ckpt.config.num_layers), [list(tokens)],
                   CheckOptions(new_tokens=2, modes=modes))


def test_the_check_runs_the_inlined_function_bodies(small_llama_checkpoint, tmp_path):
    """Only the two BitNest ops are Python ops in the check's session; the functions' standard-op bodies run. A
    wrong body (RmsNorm with ReduceMax for ReduceMean) fails the check: with the functions deleted and run as the
    torch backend's Python math, as the check used to, it went unseen."""
    from plugins.contracts import DOMAIN
    from plugins.onnx.ort_ops import ort_model
    path = small_onnx(small_llama_checkpoint, tmp_path)
    model = onnx.load(path)
    inlined = ort_model(model, inline_functions=True)
    custom = {n.op_type for n in inlined.graph.node if n.domain not in ("", DOMAIN)}
    assert custom == {"DualPlaneGemv", "NestedKvAttention"} and len(inlined.functions) == 0
    assert_checked(check(small_llama_checkpoint, path))
    for f in model.functions:
        for node in f.node:
            if f.name == "RmsNorm" and node.op_type == "ReduceMean":
                node.op_type = "ReduceMax"
    bad = tmp_path / "bad.onnx"
    onnx.save(model, str(bad))
    r = check(small_llama_checkpoint, bad, modes=("target-kv8",))
    assert r["layer_err_median"] > 0.01, r


def test_the_reference_shares_no_code_with_what_it_checks():
    """edge.checks.step_reference imports none of the code the onnxruntime ops or the torch backend run."""
    tree = ast.parse((ROOT / "edge" / "checks" / "step_reference.py").read_text())
    imported = {a.name if isinstance(n, ast.Import) else n.module for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in (n.names if isinstance(n, ast.Import) else [n])}
    shared = {m for m in imported if m and (m.startswith(("edge.", "export.")) or
                                            (m.startswith("plugins") and m != "plugins.hadamard"))}
    assert shared == set(), shared


def _single_node_model(op_inputs, shapes, n: int):
    from onnx import TensorProto as T
    from onnx import helper as h

    from plugins.contracts import DOMAIN, DOMAIN_VERSION
    from plugins.onnx.schemas import register_schemas
    from plugins.step_contract import IR_VERSION, OPSET
    register_schemas()
    types = [T.FLOAT, T.INT32, T.INT32, T.FLOAT16, T.INT64, T.FLOAT16]
    ins = [h.make_tensor_value_info(n, t, s) for n, t, s in zip(op_inputs, types, shapes)]
    node = h.make_node("DualPlaneGemv", op_inputs, ["y"], domain=DOMAIN, name="gemv")
    graph = h.make_graph([node], "g", ins, [h.make_tensor_value_info("y", T.FLOAT, ["M", n])])
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", OPSET), h.make_opsetid(DOMAIN, DOMAIN_VERSION)],
                     ir_version=IR_VERSION)
    onnx.checker.check_model(m, full_check=True)
    return m


@pytest.mark.parametrize("tiled", [False, True])
@pytest.mark.parametrize("view", ["draft", "target"])
def test_gemv_with_offset_matches_reference(view, tiled, gen, tmp_path):
    """The top4of8 form (offset input) through onnxruntime against the float64 reference, fresh inputs, with the
    planes canonical ([N, K/8] words) and warp-tiled ([N/32, K/G, G/32, 32, 4], what the step graph carries): the
    schema infers N from either, and the tiled node's rows are the canonical node's, bit for bit."""
    from plugins.contracts import view_code
    from plugins.kernels.tiling import tile_planes
    from plugins.nesting import nest_top4of8
    from plugins.onnx.ort_ops import ort_session
    from plugins.packing import pack_nibbles
    from plugins.reference import dual_plane_linear
    from plugins.step_contract import as_words

    n, k, g, m = 96, 192, 64, 5
    codes = nest_top4of8(torch.randn(n, k, generator=gen), g)
    base, refine = pack_nibbles(codes.q4), pack_nibbles(codes.qr)
    x = torch.randn(m, k, generator=gen)
    names = ["x", "base", "refine", "scale", "view", "offset"]
    planes = (base, refine, codes.scale, codes.offset)
    feeds = {"x": x.numpy(), "view": np.asarray([view_code(view)], np.int64)}
    ys = []
    for layout in sorted({False, tiled}):
        p = tile_planes(*planes) if layout else None
        b, r, sc, off = (p.base, p.refine, p.scale, p.offset) if layout else planes
        feeds.update({"base": as_words(b).numpy(), "refine": as_words(r).numpy(), "scale": sc.numpy(),
                      "offset": off.numpy()})
        shapes = [["M", k]] + [list(feeds[name].shape) for name in names[1:4]] + [[1], list(off.shape)]
        path = tmp_path / f"gemv-{layout}.onnx"
        onnx.save(_single_node_model(names, shapes, n), str(path))
        ys.append(torch.from_numpy(ort_session(path).run(None, feeds)[0]))
    y = ys[-1]
    assert y.shape == (m, n) and torch.equal(y, ys[0])
    ref = dual_plane_linear(x, base, refine, codes.scale, view, codes.offset, act_int8=True)
    err = float((y.double() - ref).norm() / ref.norm())
    assert err < 1e-6, f"{view}: relative error {err}"


def test_verify_onnx_missing_file_is_one_line(rtn_checkpoint, tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "verify_onnx.py"), "--checkpoint", str(rtn_checkpoint),
                          "--onnx", str(tmp_path / "none.onnx")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "does not exist" in out.stderr and "--onnx" in out.stderr


def test_export_engine_refuses_here_with_reason(tmp_path):
    from export.trt.build import engine_build_unavailable
    if engine_build_unavailable() is None:
        pytest.skip("TensorRT and a GPU are present: the engine build runs instead (tests/test_tensorrt.py)")
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "export.py"), "--out", str(tmp_path / "ck"),
                          "--engine"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "--engine" in out.stderr
    assert "TensorRT" in out.stderr or "GPU" in out.stderr
    assert not (tmp_path / "ck").exists()  # refused before any export work
