"""Sampled speculation emits the target's own distribution (Leviathan et al.): γ = 4 rounds with top-k and top-p
filtering on a tiny real export (1 layer, vocabulary 64, so the target's exact distribution over short continuations
can be enumerated), thousands of seeded generations, chi-square against the target's autoregressive distribution:
the joint law of the first three tokens and the marginal law of the fifth (which needs the bonus token of a fully
accepted round or a later round). The passes run on the native step (the sampling is its caller's, the same on every
backend; 4,000 generations take ~10 s there against ~60 s on the cpu backend); a residual distribution replaced by
the target's own fails it (chi-square 425 against a bound of 106). The one-token, unfiltered case is in tests/test_sampling.py."""

import math

import pytest
import torch

from edge.backends import make_engine
from edge.decode.config import GenerateConfig
from edge.decode.generate import generate
from edge.decode.sampling import SamplingConfig, probs
from edge.model.checkpoint import load_checkpoint

PROMPT = [1, 5, 9]
SAMPLING = dict(temperature=0.9, top_k=4, top_p=0.9)
RUNS = 4000


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, default_model):
    """A 1-layer Llama with a 64-token vocabulary (peaked random weights, so draft and target differ), RTN export."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from export.pipeline import ExportOptions, run_export
    from export.quantize import QuantOptions
    from tests.conftest import save_small_hf_model
    torch.manual_seed(7)
    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=32, max_position_embeddings=128, tie_word_embeddings=True,
                      initializer_range=0.2)
    folder = save_small_hf_model(tmp_path_factory.mktemp("tiny"), LlamaForCausalLM(cfg).eval(), default_model)
    out = tmp_path_factory.mktemp("ckpt") / "tiny"
    run_export(ExportOptions(out=str(out), model=str(folder), rotation="none", quant=QuantOptions(method="rtn")))
    return out


@pytest.fixture
def one_thread():
    """Tiny passes: one thread (two threads on a busy 2-core machine spend 50x the time waiting for each other)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def target_law(eng, cfg: SamplingConfig, length: int) -> dict[tuple, float]:
    """Exact probability of every continuation of `length` tokens under the target's own filtered sampling."""
    law = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for prefix, pr in law.items():
            eng.reset()
            p = probs(eng.prefill(PROMPT + list(prefix)), cfg)                       # [V] float64
            for tok in torch.nonzero(p).flatten().tolist():
                nxt[prefix + (tok,)] = pr * float(p[tok])
        law = nxt
    return law


def chi2_p_below(counts: dict, law: dict, n: int, alpha: float = 1e-4) -> tuple[float, float]:
    """(chi-square statistic, its critical value at `alpha`), cells with expectation < 5 pooled into one."""
    big = {c for c, p in law.items() if n * p >= 5}
    obs = [counts.get(c, 0) for c in big] + [n - sum(counts.get(c, 0) for c in big)]
    exp = [n * law[c] for c in big] + [n * (1 - sum(law[c] for c in big))]
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp) if e > 0)
    k = sum(e > 0 for e in exp) - 1
    z = {1e-4: 3.719}[alpha]                                                  # one-sided normal quantile
    crit = k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3         # Wilson-Hilferty
    return stat, crit


def test_speculative_sampling_follows_the_target_distribution(tiny, one_thread):
    eng = make_engine("native", load_checkpoint(tiny), 32)
    cfg = SamplingConfig(**SAMPLING)
    first3, fifth, accepted, drafted = {}, {}, 0, 0
    for seed in range(RUNS):
        out, stats = generate(eng, PROMPT, GenerateConfig(policy="speculative", gamma=4, max_new_tokens=5,
                                                          sampling=SamplingConfig(**SAMPLING, seed=seed)), set())
        first3[tuple(out[:3])] = first3.get(tuple(out[:3]), 0) + 1
        fifth[(out[4],)] = fifth.get((out[4],), 0) + 1
        accepted, drafted = accepted + stats.accepted, drafted + stats.drafted
    assert 0.2 < accepted / drafted < 0.95, "the rejection branch and full acceptance must both be exercised"
    law3 = target_law(eng, cfg, 3)
    stat, crit = chi2_p_below(first3, law3, RUNS)
    assert stat < crit, f"first three tokens depart from the target's law: chi2 {stat:.1f} > {crit:.1f}"
    law5 = {}
    for seq, p in target_law(eng, cfg, 5).items():
        law5[(seq[4],)] = law5.get((seq[4],), 0.0) + p
    stat, crit = chi2_p_below(fifth, law5, RUNS)
    assert stat < crit, f"the fifth token departs from the target's law: chi2 {stat:.1f} > {crit:.1f}"
