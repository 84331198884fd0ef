"""What the draft reads of a nested head (edge.model.draft_head): `8bit` reads the target's 8-bit head, `4bit` its base
plane, `shortlist` the base plane's top K rows re-scored at 8 bits and -inf elsewhere; the manifest records the
setting (absent: `4bit`), a runtime overrides it, the bytes of each pass follow it, and speculation stays lossless."""

import math

import pytest
import torch

from edge.backends import make_backend
from edge.backends.torch_ref import TorchBackend
from edge.decode.config import GenerateConfig
from edge.decode.sampling import SamplingConfig, probs
from edge.decode.signals import entropy_and_margin
from edge.engine.stats import embedding_row_bytes, weight_bytes_per_pass
from edge.errors import BitNestError, CheckpointError
from edge.model.checkpoint import HEAD, load_checkpoint, set_draft_head
from edge.model.decoder import Decoder
from edge.model.draft_head import order_keys, shortlist_ids
from edge.llm import Runtime
from tests.conftest import manifest_copy, stored_tensor_bytes


def _hidden(ck, gen, m=3):
    """Head inputs [M, H] of the scale the final norm gives (unit RMS times the norm weight)."""
    return torch.randn(m, ck.config.hidden_size, generator=gen) * ck.tensors["model.norm.weight"].float()


def test_shortlist_ids_break_ties_by_the_lower_id(gen):
    """Against the rule itself on logits full of ties (small integers): larger logit first, lower id first among
    equals; -0.0 and +0.0 are equal logits. torch.topk alone leaves the order of ties, and so the set at the boundary,
    unspecified."""
    logits = torch.randint(-4, 5, (3, 997), generator=gen).float()
    logits[0, 10], logits[0, 11] = -0.0, 0.0
    for k in (1, 37, 500, 997):
        got = shortlist_ids(logits, k)
        for row, ids in zip(logits.tolist(), got.tolist()):
            want = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
            assert ids == want, k
    assert order_keys(logits).unique(dim=-1).shape[-1] == 997                   # every key distinct


def test_each_setting_reads_the_head_at_its_view(rtn_checkpoint, gen):
    """Torch backend (INT8 activations, each output row computed alone): the 8bit draft's logits are the target
    head's bit for bit, the 4bit draft's the base plane's; the shortlist's are the target head's on the base plane's
    top K and -inf elsewhere. The target view reads the whole 8-bit head whatever the setting."""
    ck = load_checkpoint(rtn_checkpoint)
    assert ck.draft_head == "8bit" and ck.manifest["draft_head"] == "8bit"       # the default export
    be = TorchBackend(ck)
    h = _hidden(ck, gen)
    full8, full4 = be.head(h, "target"), be.head(h, "draft")                      # [M, V]
    dec = lambda setting, k=64: Decoder(ck.config, be, ck.rotations, setting, k)
    assert torch.equal(dec("8bit").head(h, "draft"), full8)
    assert torch.equal(dec("4bit").head(h, "draft"), full4)
    for setting in ("8bit", "4bit", "shortlist"):
        assert torch.equal(dec(setting).head(h, "target"), full8), setting
    for k in (32, 64):
        out = dec("shortlist", k).head(h, "draft")
        ids = shortlist_ids(full4, k)
        kept = torch.zeros_like(out, dtype=torch.bool).scatter_(-1, ids, True)
        assert torch.equal(kept, out.isfinite()) and bool((out[~kept] == float("-inf")).all()), k
        assert torch.equal(out[kept], full8[kept]), k                           # re-scored at 8 bits
        assert not torch.equal(out[kept], full4[kept]), k                       # (which the base plane is not)


def test_cpu_backend_rescores_rows_as_its_target_head(rtn_checkpoint, gen):
    """The cpu backend reads the shortlist's rows back from its re-laid planes. Against its own whole target head:
    within 1e-2 relative per token (its int4 GEMM returns bfloat16, 8 significant bits; the rows are summed in float32);
    rows read at the base plane only would be off by the 4-bit head's error (~10% and more)."""
    ck = load_checkpoint(rtn_checkpoint)
    be = make_backend("cpu", ck)
    h = _hidden(ck, gen, m=2)
    full8 = be.head(h, "target")
    ids = torch.stack([torch.randperm(ck.config.vocab_size, generator=gen)[:64] for _ in range(2)])
    ids[0, :3] = torch.tensor([0, 63, ck.config.vocab_size - 1])                 # first and last rows of blocks
    got, want = be.head_rows(h, ids), full8.gather(-1, ids)
    err = ((got - want).norm(dim=-1) / want.norm(dim=-1)).max()
    assert float(err) < 1e-2, float(err)


def test_triton_backend_rescores_rows_as_the_reference(rtn_checkpoint, gen):
    """The triton backend's re-scoring (each token's K rows gathered on the kernel device, through the dual-plane
    GEMV; the Triton interpreter here) against the torch backend's (the reference semantics): within 1e-5 relative,
    the kernels' float32 summation order (tests/test_kernels.py); base-plane rows would be off by ~10%."""
    from edge.backends.triton_gpu import TritonBackend
    ck = load_checkpoint(rtn_checkpoint)
    ids = torch.stack([torch.randperm(ck.config.vocab_size, generator=gen)[:64] for _ in range(2)])
    h = _hidden(ck, gen, m=2)
    want = TorchBackend(ck).head_rows(h, ids)
    tb = TritonBackend(ck)
    got = tb.head_rows(h.to(tb.device), ids.to(tb.device)).cpu()
    err = float((got - want).norm() / want.norm())
    assert err < 1e-5, err


def test_bytes_of_each_setting(rtn_checkpoint):
    """Per pass: the 8bit draft reads the head's two planes (28.3 MB) where the 4bit one reads the base plane
    (14.2 MB); the shortlist reads the base plane and, per token, K rows of the refinement plane and their scales."""
    ck = load_checkpoint(rtn_checkpoint)
    v, h = ck.config.vocab_size, ck.config.hidden_size
    g = ck.linears[HEAD].group_size
    scales = 2 * v * (h // g)
    blocks = weight_bytes_per_pass(set_draft_head(ck, "4bit"), "draft") - (v * h // 2 + scales)
    assert weight_bytes_per_pass(set_draft_head(ck, "8bit"), "draft") == blocks + v * h + scales
    assert weight_bytes_per_pass(set_draft_head(ck, "shortlist", 32), "draft", tokens=3) == \
        blocks + v * h // 2 + scales + 3 * 32 * (h // 2 + 2 * (h // g))
    for setting in ("8bit", "4bit", "shortlist"):
        assert weight_bytes_per_pass(set_draft_head(ck, setting), "target") == \
            weight_bytes_per_pass(set_draft_head(ck, "8bit"), "draft") + \
            sum(s.shape[0] * s.shape[1] // 2 for n, s in ck.linears.items() if n != HEAD), setting


@pytest.mark.parametrize("setting", ["shortlist", "4bit"])
def test_runtime_override_is_lossless_and_counted(rtn_checkpoint, setting):
    rt = Runtime(rtn_checkpoint, backend="cpu", max_context=256, draft_head=setting, shortlist_k=32)
    assert rt.ckpt.draft_head == setting and rt.ckpt.shortlist_k == 32
    ids = rt.encode("Write two sentences about the sea.")
    target = rt.generate(ids, GenerateConfig(policy="target", max_new_tokens=16))
    spec = rt.generate(ids, GenerateConfig(policy="speculative", max_new_tokens=16))
    assert spec["tokens"] == target["tokens"]
    summary = spec["stats"].summary()
    assert summary["draft_head"] == setting and summary.get("shortlist_k") == (32 if setting == "shortlist" else None)
    row = embedding_row_bytes(rt.ckpt)
    rows = 32 * (576 // 2 + 2 * 576 // rt.ckpt.linears[HEAD].group_size) if setting == "shortlist" else 0
    assert rt.engine.token_weight_bytes["draft"] == row + rows
    d = rt.generate(ids, GenerateConfig(policy="draft", max_new_tokens=6))["stats"]      # one-token draft passes
    # a draft pass reads every stored tensor but the refinement planes (the head's too: its base plane and scales,
    # the shortlist's rows a token apart), counted from the shards' headers, not by the engine
    stored = stored_tensor_bytes(rtn_checkpoint)
    draft = sum(b for name, b in stored.items() if not name.endswith(".refine"))
    assert d.weight_bytes == d.draft_passes * (draft + row + rows) > 0


def test_shortlist_sampling_stays_on_the_shortlist(rtn_checkpoint, gen):
    """Sampling proposes from softmax over the shortlist only: zero probability elsewhere, a finite entropy."""
    ck = load_checkpoint(rtn_checkpoint)
    logits = Decoder(ck.config, TorchBackend(ck), ck.rotations, "shortlist", 16).head(_hidden(ck, gen, 1), "draft")[0]
    q = probs(logits, SamplingConfig(temperature=0.9))
    assert int((q > 0).sum()) == 16 and abs(float(q.sum()) - 1) < 1e-12
    h, m = entropy_and_margin(logits)
    assert 0 < h <= math.log(16) + 1e-9 and m >= 0                               # at most uniform over 16


def test_manifest_fields_are_validated(rtn_checkpoint, small_llama_checkpoint, tmp_path):
    unrecorded = manifest_copy(rtn_checkpoint, tmp_path / "old", lambda m: (m.pop("draft_head"), m.pop("shortlist_k")))
    ck = load_checkpoint(unrecorded)
    assert ck.draft_head == "4bit" and ck.shortlist_k == 64          # what a nested head's draft read before the field
    for i, (field, value, match) in enumerate([("draft_head", "9bit", "unknown draft head '9bit'"),
                                               ("shortlist_k", 0, "shortlist size 0"),
                                               ("shortlist_k", True, "shortlist size True"),
                                               ("shortlist_k", "64", "shortlist size '64'"),
                                               ("shortlist_k", 49153, "shortlist size 49153"),
                                               ("draft_vocab", 0, r"draft vocabulary \(--draft-vocab\) 0"),
                                               ("draft_vocab", 49153, "draft vocabulary .* 49153"),
                                               ("draft_vocab", True, "draft vocabulary .* True")]):
        bad = manifest_copy(rtn_checkpoint, tmp_path / f"bad{i}", lambda m: m.update({field: value}))
        with pytest.raises(CheckpointError, match=match):
            load_checkpoint(bad)
    float16 = manifest_copy(small_llama_checkpoint, tmp_path / "f16", lambda m: m.update(draft_head="8bit"))
    with pytest.raises(CheckpointError, match="the head is float16"):
        load_checkpoint(float16)
    with pytest.raises(BitNestError, match="needs a nested LM head"):
        set_draft_head(load_checkpoint(small_llama_checkpoint), "8bit")
    with pytest.raises(BitNestError, match="unknown draft head"):
        set_draft_head(load_checkpoint(rtn_checkpoint, verify=False), "2bit")
    recorded = manifest_copy(rtn_checkpoint, tmp_path / "vocab", lambda m: m.update(draft_vocab=4096))
    assert load_checkpoint(recorded).draft_vocab == 4096
    with pytest.raises(BitNestError, match=r"draft vocabulary \(--draft-vocab\) 16 must be an integer in \[64,"):
        set_draft_head(load_checkpoint(recorded), "shortlist", 64, 16)       # fewer ids than the shortlist's rows
    with pytest.raises(BitNestError, match="needs a nested LM head"):
        set_draft_head(load_checkpoint(small_llama_checkpoint), draft_vocab=4096)


def test_the_default_export_folder_names_its_settings():
    """The default export's cache folder is keyed by every default option: the folder of the float16-head default
    (before issue 21) or of any other head setting is never taken for the current default."""
    from export.pipeline import ExportOptions, default_checkpoint_path
    from export.quantize import QuantOptions
    here = default_checkpoint_path()
    assert here.name != "smollm2-135m-instruct-bitnest" and here == default_checkpoint_path(ExportOptions(out="x"))
    assert default_checkpoint_path(ExportOptions(out="", quant=QuantOptions(quantize_head=False))) != here
    assert default_checkpoint_path(ExportOptions(out="", draft_head="4bit")) != here


def test_bad_head_options_are_one_line_errors(small_llama_checkpoint, tmp_path, capsys):
    """Before any work: a draft head for a float16 head, at export and on a checkpoint whose head is float16; a draft
    vocabulary with the step graph, which scores every id. The first in a process of its own, the others through the
    same entry point in this one."""
    import subprocess
    import sys

    from tests.conftest import ROOT, command_here
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "export.py"), "--out", str(tmp_path / "ck"), "--head",
                          "float16", "--draft-head", "8bit"], capture_output=True, text=True, timeout=300)
    runs = [(out, "drop --head float16"),
            (command_here(capsys, "chat", "--checkpoint", small_llama_checkpoint, "--backend", "torch", "--prompt", "Hi",
                          "--draft-head", "shortlist"), "needs a nested LM head"),
            (command_here(capsys, "export", "--out", tmp_path / "ck", "--onnx", "--draft-vocab", "4096"),
             "drop --draft-vocab with --onnx")]
    for out, says in runs:
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and says in out.stderr, out.stderr
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("setting", ["8bit", "4bit", "shortlist"])
def test_a_draft_vocabulary_scores_its_ids_only(rtn_checkpoint, gen, setting):
    """Torch backend: with a draft vocabulary of N ids the draft's logits are the setting's own on ids [0, N) (the
    shortlist's K rows taken among those ids) and -inf past them; the target's are untouched. The bytes a draft pass
    reads of the head are those of its N rows."""
    ck = load_checkpoint(rtn_checkpoint)
    be, h, n, k = TorchBackend(ck), _hidden(ck, gen), 3000, 32
    whole = Decoder(ck.config, be, ck.rotations, setting, k).head(h, "draft")
    part = Decoder(ck.config, be, ck.rotations, setting, k, n)
    got = part.head(h, "draft")
    assert bool((got[:, n:] == float("-inf")).all())
    if setting == "shortlist":
        ids = shortlist_ids(be.head(h, "draft")[:, :n], k)                     # the best K of the first N base logits
        assert torch.equal(got.isfinite(), torch.zeros_like(got, dtype=torch.bool).scatter_(-1, ids, True))
        assert torch.equal(got.gather(-1, ids), be.head(h, "target").gather(-1, ids))
    else:
        assert torch.equal(got[:, :n], whole[:, :n])
    assert torch.equal(part.head(h, "target"), be.head(h, "target"))
    v, hid, g = ck.config.vocab_size, ck.config.hidden_size, ck.linears[HEAD].group_size
    row = hid // 2 * (2 if setting == "8bit" else 1) + 2 * (hid // g)         # one head row's planes and scales
    full = weight_bytes_per_pass(set_draft_head(ck, setting, k, v), "draft")   # v: the whole vocabulary
    assert ck.draft_vocab is None
    target = weight_bytes_per_pass(ck, "target")
    assert full - weight_bytes_per_pass(set_draft_head(ck, setting, k, n), "draft") == (v - n) * row
    assert weight_bytes_per_pass(ck, "target") == target and ck.draft_vocab == n


def test_evaluate_scores_a_shortlist_draft_through_its_8bit_head(rtn_checkpoint):
    """`bitnest evaluate` on a shortlist draft: its perplexity is the 8-bit head's (its own logits are -inf past its
    K rows: infinite by construction), its agreement the shortlist's own: at K = 1 the only finite row is the base
    plane's argmax, so its agreement is the 4-bit head's, not the 8-bit head's."""
    from edge.analysis.evaluate import EvalOptions, evaluate
    run = {head: evaluate(EvalOptions(str(rtn_checkpoint), corpora=("code",), tokens=192, window=96,
                                      with_reference=False, draft_head=head, shortlist_k=k))
           for head, k in (("shortlist", 1), ("8bit", None), ("4bit", None))}
    short, eight, four = run["shortlist"], run["8bit"], run["4bit"]
    assert short["draft_ppl_head"] == "8bit" and eight["draft_ppl_head"] == "8bit"
    assert math.isfinite(short["ppl"]["draft"]["code"]) and short["ppl"]["draft"] == eight["ppl"]["draft"]
    assert short["ppl"]["target"] == eight["ppl"]["target"]
    assert short["agreement"] == four["agreement"] != eight["agreement"]
