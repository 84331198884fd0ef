"""A nested tied head serves the input embedding too (manifest `embedding: head_target`, the default export since
issue 21): no float16 copy is stored, every backend and the ONNX step graph (tests/test_onnx.py) look rows up from the
head's planes at the target view, the reader refuses inconsistent checkpoints, and speculation stays lossless."""

import json
import shutil

import pytest
import torch

from edge.backends import make_backend
from edge.decode.config import GenerateConfig
from edge.engine.stats import embedding_row_bytes
from edge.errors import CheckpointError
from edge.model.checkpoint import EMBED, HEAD, load_checkpoint
from edge.model.manifest import INDEX, MANIFEST, SEAL, manifest_seal, sha256_file
from edge.llm import Runtime
from plugins.packing import unpack_nibbles
from plugins.reference import dequantized_weight


@pytest.fixture(scope="module")
def head_checkpoint(rotated_checkpoint):
    """A real RTN export of the default model with R1/R2/R4 and the default head: nested, embedding from its planes."""
    return rotated_checkpoint


def _ids(gen, n=40, vocab=49152):
    return torch.randint(0, vocab, (n,), generator=gen)


def test_no_float16_embedding_is_stored(head_checkpoint):
    ck = load_checkpoint(head_checkpoint)
    assert ck.manifest["embedding"] == "head_target" and ck.embedding_from_head and ck.head_nested
    assert EMBED not in ck.tensors and "lm_head.weight" not in ck.tensors
    assert not any(t.dtype == torch.float16 and t.shape[0] == ck.config.vocab_size and t.dim() == 2
                   and not n.endswith(".scale") for n, t in ck.tensors.items())
    # the lookup reads one row of both planes and its scales: 576 + 2 * 9 bytes instead of 1152
    assert embedding_row_bytes(ck) == 576 + 2 * 576 // ck.linears[HEAD].group_size


def test_torch_backend_rows_are_the_head_target_view(head_checkpoint, gen):
    ck = load_checkpoint(head_checkpoint)
    ids = _ids(gen)
    want = dequantized_weight(*ck.planes(HEAD)[:3], "target")[ids]                    # [T, H]
    assert torch.equal(make_backend("torch", ck).embed(ids), want)


def test_cpu_backend_rows_from_relaid_planes(head_checkpoint, gen):
    """The cpu backend re-lays the planes in place: rows are read back from the op's layout, bit for bit equal to
    the canonical codes at the backend's bfloat16 scales."""
    ck = load_checkpoint(head_checkpoint)
    base, refine, scale = (t.clone() for t in ck.planes(HEAD)[:3])
    be = make_backend("cpu", ck)
    assert HEAD + ".base" not in ck.tensors           # no canonical copy beside the re-laid one
    ids = torch.cat((_ids(gen), torch.tensor([0, 31, 32, 63, 64, 4095, 4096, 49151])))   # blocks and relay chunks
    g = be.layout[HEAD][4]
    s = scale.to(torch.bfloat16).float().repeat_interleave(g, 1)[ids]                  # [T, H]
    want = (16 * unpack_nibbles(base[ids]).float() + unpack_nibbles(refine[ids]).float()) * (s / 16)
    assert torch.equal(be.embed(ids), want)


def _copy_with(src, dst, manifest_edit=None, tensors_add=None):
    """A copy of checkpoint `src` with its manifest edited and resealed, and `tensors_add` written as one more shard
    that the index names and the manifest seals."""
    shutil.copytree(src, dst)
    m = json.loads((dst / MANIFEST).read_text())
    if tensors_add:
        from safetensors.torch import save_file
        save_file(tensors_add, str(dst / "extra.safetensors"))
        index = json.loads((dst / INDEX).read_text())
        index["weight_map"].update({k: "extra.safetensors" for k in tensors_add})
        (dst / INDEX).write_text(json.dumps(index))
        m["files"].update({n: sha256_file(dst / n) for n in ("extra.safetensors", INDEX)})
    if manifest_edit or tensors_add:
        (manifest_edit or (lambda m: None))(m)
        m[SEAL] = manifest_seal(m)             # sealed again: the reader's own checks are what is tested here
        (dst / MANIFEST).write_text(json.dumps(m))
    return dst


def test_reader_refuses_inconsistent_embedding(head_checkpoint, tmp_path):
    copy = _copy_with(head_checkpoint, tmp_path / "copy",
                      tensors_add={EMBED: torch.zeros(49152, 576, dtype=torch.float16)})
    with pytest.raises(CheckpointError, match="beside the head's planes"):
        load_checkpoint(copy, verify=False)
    float16 = _copy_with(head_checkpoint, tmp_path / "float16", lambda m: m.update(embedding="float16"))
    with pytest.raises(CheckpointError, match=f"lack tensor {EMBED}"):
        load_checkpoint(float16)
    # a float16 head (and so no draft head setting, refused first otherwise) under a head_target embedding
    no_head = _copy_with(head_checkpoint, tmp_path / "nohead",
                         lambda m: (m.update(head="float16"), m.pop("draft_head", None), m.pop("shortlist_k", None)))
    with pytest.raises(CheckpointError, match="needs a nested head"):
        load_checkpoint(no_head)
    unknown = _copy_with(head_checkpoint, tmp_path / "unknown", lambda m: m.update(embedding="int4"))
    with pytest.raises(CheckpointError, match="'int4' is not one of"):
        load_checkpoint(unknown)


def test_speculation_stays_lossless_and_counts_row_bytes(head_checkpoint):
    rt = Runtime(head_checkpoint, backend="cpu", max_context=256)
    ids = rt.encode("Write two sentences about the sea.")
    target = rt.generate(ids, GenerateConfig(policy="target", max_new_tokens=24))
    spec = rt.generate(ids, GenerateConfig(policy="speculative", max_new_tokens=24))
    assert spec["tokens"] == target["tokens"]
    s = target["stats"]
    row = embedding_row_bytes(rt.ckpt)
    assert s.weight_bytes == s.target_passes * (rt.engine.pass_weight_bytes["target"] + row)


def test_native_step_rows_from_the_head(head_checkpoint):
    """The native step looks rows up in the head's planes too: two real layers agree with the torch reference
    (whose rows are the target view, tested above) at float32 rounding, or by a shown flip of an INT8 activation
    code at a rounding tie (tests/reference_pairs.py: on an AVX2-only CPU the draft view's rows moved 2.3e-3 so),
    and speculation stays lossless."""
    from edge.backends.native import native_unavailable
    from tests.reference_pairs import bound_after, engines, explain, row_errors, run_traced
    from tests.test_native_engine import _agreement_scenario
    if native_unavailable() is not None:
        pytest.skip(f"native backend: {native_unavailable()}")
    for view in ("target", "draft"):
        native, ref = engines(head_checkpoint, 2)
        scenario = _agreement_scenario(view)
        got = list(scenario(native))
        rows = row_errors(got, run_traced(ref, scenario)[0])[0]
        assert max(rows) < bound_after(explain(head_checkpoint, 2, scenario, got)), (view, rows)
    rt = Runtime(head_checkpoint, backend="native", max_context=256)
    ids = rt.encode("Write two sentences about the sea.")
    target = rt.generate(ids, GenerateConfig(policy="target", max_new_tokens=24))
    assert rt.generate(ids, GenerateConfig(policy="speculative", max_new_tokens=24))["tokens"] == target["tokens"]
