"""Learned rotations (export.rotation.learned): the differentiable nest equals the stored one bit for bit and passes
the straight-through and scale gradients, Cayley SGD stays on the orthogonal group and descends, and a learned
R1/R2 export keeps the model's function and records its training."""

import subprocess
import sys

import pytest
import torch

from edge.model.checkpoint import load_checkpoint
from edge.model.decoder import Decoder, OnlineRotations
from edge.model.float_store import FloatWeights
from export.rotation.learned import LearnOptions, cayley_step, nest_views
from export.rotation.plan import RotationPlan, rotate
from plugins.nesting import dequantize, nest_rtn
from plugins.hadamard import random_orthogonal
from tests.conftest import ROOT, save_small_hf_model


@pytest.mark.parametrize("shape,g", [((192, 576), 64), ((64, 1536), 128), ((7, 32), 16)])
def test_nest_views_is_the_rtn_nest_bit_for_bit(gen, shape, g):
    w = torch.randn(*shape, generator=gen) * 0.05
    w[0, :g] = 0.0                                             # an all-zero group (smallest scale)
    draft, target = nest_views(w, g)
    codes = nest_rtn(w, g)
    assert torch.equal(draft, dequantize(codes, "draft")) and torch.equal(target, dequantize(codes, "target"))


def _reference_views(w, g):
    """The same nest written with autograd: rounding and clipping passed straight through (the codes' gradient is 1,
    as nest_views defines it: no clamp of autograd's, whose gradient at a bound is 1 up to torch 2.13 and 0 from
    2.14), the float16 scale passed straight through."""
    n, k = w.shape
    wg = w.reshape(n, k // g, g)
    s = wg.abs().amax(-1, keepdim=True) / 7
    s = s + (s.half().float() - s).detach()
    ste = lambda x, code: x + (code(torch.round(x.detach())) - x).detach()
    q4 = ste(wg / s, lambda r: torch.clamp(r, -8, 7))
    draft = q4 * s
    lo = torch.where(q4.detach() == -8, 0.0, -8.0)
    qr = ste((wg - draft) / (s / 16), lambda r: torch.clamp(torch.maximum(r, lo), max=7.0))
    return draft.reshape(n, k), ((16 * q4 + qr) * (s / 16)).reshape(n, k)


def test_nest_views_gradient_is_straight_through_plus_the_scale_term(gen):
    w = (torch.randn(24, 128, generator=gen) * 0.1).requires_grad_(True)
    gd, gt = torch.randn(24, 128, generator=gen), torch.randn(24, 128, generator=gen)
    d, t = nest_views(w, 32)
    (d * gd + t * gt).sum().backward()
    got = w.grad.clone()
    w.grad = None
    d, t = _reference_views(w, 32)
    (d * gd + t * gt).sum().backward()
    # float32 sums over a group of 32 products of O(1) values in two orders: ~1e-6 apart (1.31e-6 seen); a missing
    # or wrong term is O(0.1)
    assert torch.allclose(got, w.grad, rtol=1e-5, atol=1e-5), float((got - w.grad).abs().max())
    assert not torch.allclose(got, gd + gt), "the scale term must reach each group's largest weight"


def test_cayley_sgd_stays_orthogonal_and_descends(gen):
    """f(R) = |R - Q|^2 / 2 (gradient R - Q) from a random start: Cayley steps keep R orthogonal in float64 and
    lower f; the opposite sign would raise it."""
    seed = int(torch.randint(0, 10_000, (), generator=gen))
    q, r = random_orthogonal(48, seed), random_orthogonal(48, seed + 1)
    m = torch.zeros_like(r)
    f = [float(((r - q) ** 2).sum() / 2)]
    for _ in range(20):
        r = cayley_step(r, r - q, m, lr=0.5, beta=0.5)
        f.append(float(((r - q) ** 2).sum() / 2))
        assert float((r @ r.T - torch.eye(48, dtype=torch.float64)).abs().max()) < 1e-12
    # it descends until momentum carries it around the optimum, and ends far below the start
    assert f[-1] < 0.05 * f[0] and all(b < a for a, b in zip(f[:10], f[1:11])), f


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory, default_model):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(99)
    cfg = LlamaConfig(vocab_size=default_model.config.vocab_size, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                      max_position_embeddings=256, tie_word_embeddings=True)
    return save_small_hf_model(tmp_path_factory.mktemp("tiny"), LlamaForCausalLM(cfg).eval(), default_model)


def test_learned_rotation_keeps_the_function_and_records_training(tiny_llama, gen):
    from export.calibration import calibration_windows
    from export.sources import load_source
    from transformers import AutoTokenizer
    src = load_source(str(tiny_llama))
    cfg = src.config
    calib = calibration_windows(AutoTokenizer.from_pretrained(src.folder), 4, 32)
    plan = RotationPlan("learned", seed=3, learn=LearnOptions(steps=3, samples=4, seq_len=32, lr=0.5))
    rotated, record, extra = rotate(src.tensors, cfg, plan, calib, lambda k: 32)
    _, _, init = rotate(src.tensors, cfg, RotationPlan("r1r2r4", seed=3))
    r1 = extra["rotation.r1"].double()
    assert float((r1 @ r1.T - torch.eye(64, dtype=torch.float64)).abs().max()) < 1e-6
    assert not torch.equal(extra["rotation.r1"], init["rotation.r1"]), "R1 must move from its Hadamard start"
    ids = torch.randint(0, cfg.vocab_size, (16,), generator=gen)
    f64 = {k: v.double() for k, v in src.tensors.items()}
    want = Decoder(cfg, FloatWeights(f64, True, torch.float64)).forward(ids, "target")
    got = Decoder(cfg, FloatWeights(rotated, True, torch.float64),
                  OnlineRotations(r1=r1, r4_size=record["r4_size"])).forward(ids, "target")
    assert ((got - want).norm() / want.norm()).item() < 1e-6
    learning = record["learning"]
    assert record["r1"]["kind"] == record["r2"]["kind"] == "learned" and record["r4_size"] == 128
    assert len(learning["curve"]) == 3 and set(learning["held_out_before"]) == {"draft", "target"}
    assert learning["held_out_after"]["draft"] > 0 and learning["r1_orthogonality_error"] < 1e-6


def test_learned_export_and_bad_options(tiny_llama, tmp_path):
    from export.pipeline import ExportOptions, run_export
    from export.quantize import QuantOptions
    out = tmp_path / "learned"
    run_export(ExportOptions(out=str(out), model=str(tiny_llama), rotation="learned", quant=QuantOptions("rtn"),
                             learn=LearnOptions(steps=1, samples=2, seq_len=16)))
    ck = load_checkpoint(out)
    assert ck.manifest["rotation"]["kind"] == "learned" and ck.rotations.r1 is not None
    r = subprocess.run([sys.executable, "scripts/export.py", "--out", str(tmp_path / "x"), "--rotation", "learned",
                        "--rotation-steps", "0"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "--rotation-steps: 0 is out of range" in lines[0], r.stderr
    with pytest.raises(ValueError, match="steps >= 1"):          # the library's own check, for callers without a CLI
        LearnOptions(steps=0)
