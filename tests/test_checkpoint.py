"""Nested checkpoints: contents, bits per weight, and a one-line error for every kind of bad input."""

import json
import shutil
import subprocess
import sys

import pytest
import torch

from edge.errors import BitNestError, CheckpointError
from edge.model.checkpoint import check_checkpoint, load_checkpoint
from edge.model.manifest import INDEX, MANIFEST, SEAL, WEIGHTS, manifest_seal, sha256_file
from export.writer import check_output_dir
from plugins.packing import unpack_nibbles
from plugins.reference import dequantized_weight
from tests.conftest import ROOT, command_here


SHARD = "layer-003.safetensors"   # one block's shard (format 2: an index and a shard per export stage)


def _copy(src, tmp_path, name="ck"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def test_checkpoint_contents(rtn_checkpoint):
    ck = load_checkpoint(rtn_checkpoint)
    m = ck.manifest
    assert m["format_version"] == 2 and m["method"] == "rtn" and m["head"] == "nested"       # the default head
    assert m["embedding"] == "head_target" and m["draft_head"] == ck.draft_head == "8bit" and m["shortlist_k"] == 64
    # every file of the folder but the manifest is listed with its own sha256 (the old check here, '"sha256" not
    # in <hex digest>', could not fail)
    on_disk = {f.name for f in ck.path.iterdir()} - {MANIFEST}
    assert set(m["files"]) == on_disk and {INDEX, SHARD, "head.safetensors", "tokenizer.json"} <= on_disk
    weight_map = json.loads((ck.path / INDEX).read_text())["weight_map"]
    assert set(weight_map) == set(ck.tensors) and weight_map["model.layers.3.mlp.down_proj.base"] == SHARD
    assert all(digest == sha256_file(ck.path / f) for f, digest in m["files"].items())
    name = "model.layers.3.mlp.down_proj"
    base, refine, scale, offset = ck.planes(name)
    assert base.dtype == refine.dtype == torch.uint8 and base.shape == (576, 768) and scale.shape == (576, 12)
    assert ck.linears["model.layers.3.self_attn.q_proj"].group_size == 64 and offset is None
    # the 8-bit code stays in range and respects eq. 9
    q4, qr = unpack_nibbles(base).int(), unpack_nibbles(refine).int()
    assert bool((qr[q4 == -8] >= 0).all()) and int((16 * q4 + qr).min()) >= -128
    # no float16 embedding: its rows are the nested head's (tests/test_embedding_from_head.py)
    assert "model.embed_tokens.weight" not in ck.tensors and ck.planes("lm_head")[0].shape == (49152, 288)


def test_linear_bits_per_weight_at_most_8_25(rtn_checkpoint):
    ck = load_checkpoint(rtn_checkpoint)
    bits = [8 + 16 / s.group_size for s in ck.linears.values()]
    n = [s.shape[0] * s.shape[1] for s in ck.linears.values()]
    stored = sum(ck.tensors[k].numel() * ck.tensors[k].element_size() for name in ck.linears
                 for k in (name + ".base", name + ".refine", name + ".scale"))
    assert stored * 8 / sum(n) == pytest.approx(sum(b * c for b, c in zip(bits, n)) / sum(n))
    assert stored * 8 / sum(n) <= 8.25


def test_draft_from_base_plane_is_the_target_minus_refinement(rtn_checkpoint):
    ck = load_checkpoint(rtn_checkpoint)
    base, refine, scale, _ = ck.planes("model.layers.0.self_attn.q_proj")
    draft = dequantized_weight(base, None, scale, "draft")
    target = dequantized_weight(base, refine, scale, "target")
    s = scale.float().repeat_interleave(64, 1)
    assert torch.equal(target - unpack_nibbles(refine).float() * (s / 16), draft)


def test_missing_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no manifest.json"):
        load_checkpoint(tmp_path)


def test_truncated_weights(rtn_checkpoint, tmp_path):
    ck = _copy(rtn_checkpoint, tmp_path)
    data = (ck / SHARD).read_bytes()
    (ck / SHARD).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(ck)
    with pytest.raises(CheckpointError, match="offsets .* do not fit its shape or the file"):
        load_checkpoint(ck, verify=False)


def test_corrupted_byte_fails_sha256(rtn_checkpoint, tmp_path):
    ck = _copy(rtn_checkpoint, tmp_path)
    with open(ck / SHARD, "r+b") as f:
        f.seek(-100, 2)
        b = f.read(1)
        f.seek(-100, 2)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(ck)


def test_missing_file_and_corrupted_manifest(rtn_checkpoint, tmp_path):
    ck = _copy(rtn_checkpoint, tmp_path)
    (ck / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="missing tokenizer.json"):
        load_checkpoint(ck)
    (ck / MANIFEST).write_text('{"format": "bitnest-nested", ')
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_checkpoint(ck)


def _edit_manifest(ck, fn, reseal=True):
    """Change the manifest; `reseal` recomputes its own sha256, so the checks behind the seal are reached."""
    m = json.loads((ck / MANIFEST).read_text())
    fn(m)
    if reseal:
        m[SEAL] = manifest_seal(m)
    (ck / MANIFEST).write_text(json.dumps(m))


def test_a_manifest_changed_after_export_fails_its_seal(rtn_checkpoint, tmp_path):
    """The manifest is not in its own file list: its seal catches a silently different config (a changed epsilon
    loaded as a different model before it existed)."""
    ck = _copy(rtn_checkpoint, tmp_path)
    _edit_manifest(ck, lambda m: m["config"].update(rms_norm_eps=1e-3), reseal=False)
    with pytest.raises(CheckpointError, match="changed after export"):
        load_checkpoint(ck)


def test_unknown_architecture_in_checkpoint(rtn_checkpoint, tmp_path):
    ck = _copy(rtn_checkpoint, tmp_path)
    _edit_manifest(ck, lambda m: m["config"].update(architecture="FooForCausalLM"))
    with pytest.raises(CheckpointError, match="unknown architecture 'FooForCausalLM'"):
        load_checkpoint(ck)


def test_group_size_not_dividing_k(rtn_checkpoint, tmp_path):
    ck = _copy(rtn_checkpoint, tmp_path)
    _edit_manifest(ck, lambda m: m["linears"]["model.layers.0.mlp.up_proj"].update(group_size=100))
    with pytest.raises(CheckpointError, match="group size 100 does not divide K=576"):
        load_checkpoint(ck)


def to_single_file(src, dst):
    """`src` (format 2) written as format 1 was: every tensor in one model.safetensors, the manifest's files and seal
    over it."""
    from safetensors.torch import save_file
    ck = load_checkpoint(src)
    dst.mkdir()
    save_file(ck.tensors, str(dst / WEIGHTS))
    m = dict(ck.manifest, format_version=1)
    for f in m["tokenizer_files"]:
        shutil.copyfile(src / f, dst / f)
    m["files"] = {n: sha256_file(dst / n) for n in [WEIGHTS] + m["tokenizer_files"]}
    m[SEAL] = manifest_seal(m)
    (dst / MANIFEST).write_text(json.dumps(m))
    return ck


def test_single_file_checkpoints_of_format_1_still_load(rtn_checkpoint, tmp_path):
    ck = to_single_file(rtn_checkpoint, tmp_path / "v1")
    for weights in ("nested", "base"):
        old = load_checkpoint(tmp_path / "v1", weights=weights)
        new = load_checkpoint(rtn_checkpoint, weights=weights)
        assert old.manifest["format_version"] == 1 and set(old.tensors) == set(new.tensors)
        assert all(torch.equal(old.tensors[k], new.tensors[k]) for k in new.tensors)
    assert len(ck.tensors) > 200


def test_index_faults_are_refused_in_one_line(rtn_checkpoint, tmp_path):
    ck = _copy(rtn_checkpoint, tmp_path)
    index = json.loads((ck / INDEX).read_text())
    index["weight_map"]["model.norm.weight"] = "stray.safetensors"          # a file the seal does not cover
    (ck / INDEX).write_text(json.dumps(index))
    _edit_manifest(ck, lambda m: m["files"].update({INDEX: sha256_file(ck / INDEX)}))
    with pytest.raises(CheckpointError, match="names stray.safetensors, which the manifest does not seal"):
        load_checkpoint(ck)
    (ck / INDEX).unlink()
    with pytest.raises(CheckpointError, match="missing model.safetensors.index.json"):
        load_checkpoint(ck)


def test_format_version_and_shape_mismatch(rtn_checkpoint, tmp_path):
    ck = _copy(rtn_checkpoint, tmp_path)
    _edit_manifest(ck, lambda m: m.update(format_version=99))
    with pytest.raises(CheckpointError, match="format version 99, made by a newer bitnest-edge.*upgrade bitnest-edge"):
        load_checkpoint(ck)
    _edit_manifest(ck, lambda m: m.update(format_version=0))
    with pytest.raises(CheckpointError, match="format version 0, this runtime reads 1, 2: re-export it"):
        load_checkpoint(ck)
    ck2 = _copy(rtn_checkpoint, tmp_path, "ck2")
    _edit_manifest(ck2, lambda m: m["config"].update(intermediate_size=1024))
    with pytest.raises(CheckpointError, match="expected|implies"):
        load_checkpoint(ck2)


def test_the_exporters_header_check_refuses_what_the_loader_refuses(rtn_checkpoint, tmp_path):
    """check_checkpoint (the export's last step, no tensor held) reads the same faults as load_checkpoint, with the
    same line, and counts the bytes the loader holds."""
    ck = load_checkpoint(rtn_checkpoint)
    assert check_checkpoint(rtn_checkpoint) == sum(t.numel() * t.element_size() for t in ck.tensors.values())

    def flip(c):
        with open(c / SHARD, "r+b") as f:
            f.seek(-100, 2)
            b = f.read(1)
            f.seek(-100, 2)
            f.write(bytes([b[0] ^ 0xFF]))
    faults = [flip, lambda c: _edit_manifest(c, lambda m: m["config"].update(intermediate_size=1024)),
              lambda c: _edit_manifest(c, lambda m: m["linears"]["model.layers.0.mlp.up_proj"].update(group_size=100)),
              lambda c: _edit_manifest(c, lambda m: m["rotation"].update(r4_size=7)),
              lambda c: (c / INDEX).unlink()]
    for i, fault in enumerate(faults):
        c = _copy(rtn_checkpoint, tmp_path, f"ck{i}")
        fault(c)
        lines = []
        for reader in (load_checkpoint, check_checkpoint):
            with pytest.raises(CheckpointError) as e:
                reader(c)
            lines.append(str(e.value))
        assert lines[0] == lines[1] and "\n" not in lines[0], lines


def test_output_folder_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "precious.txt").write_text("user data")
    with pytest.raises(BitNestError, match="exists and is not a BitNest checkpoint"):
        check_output_dir(tmp_path)
    check_output_dir(tmp_path / "fresh")  # a new folder is fine


def _cli(*args):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, cwd=ROOT, timeout=600)


@pytest.mark.parametrize("case", ["missing", "corrupt"])
def test_evaluate_cli_bad_checkpoint_is_one_line(rtn_checkpoint, tmp_path, case):
    ck = tmp_path / "missing"
    if case == "corrupt":
        ck = _copy(rtn_checkpoint, tmp_path)
        (ck / SHARD).write_bytes(b"\0" * 64)
    r = _cli("scripts/evaluate.py", "--checkpoint", ck, "--tokens", "16")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr and lines[0].startswith("bitnest-evaluate: error:"), r.stderr


def test_export_cli_errors_are_one_line(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("keep me")
    hf = tmp_path / "foo"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"architectures": ["FooForCausalLM"], "hidden_size": 8}))
    for args, needle in [
        (["--out", tmp_path, "--method", "rtn"], "exists and is not a BitNest checkpoint"),
        (["--out", tmp_path / "o", "--model", tmp_path / "absent"], "does not exist"),
        (["--out", tmp_path / "o", "--model", hf], "unknown architecture 'FooForCausalLM'"),
        (["--out", tmp_path / "o", "--group-size", "96"], "power of two"),
    ]:
        # the first in a process of its own (its exit status and output as a user sees them), the rest in this one
        r = _cli("scripts/export.py", *args) if needle.startswith("exists") else command_here(capsys, "export", *args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and needle in lines[0], (args, r.stderr)
    assert (tmp_path / "notes.txt").read_text() == "keep me"
