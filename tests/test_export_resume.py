"""The streamed export as a user meets its faults: killed (SIGKILL) mid-block, the same command resumes at that block and
writes the bytes an uninterrupted run writes; a file-size limit hit while a shard is written keeps the finished
stages and says so in one line; a plan past the host's memory is refused before any work."""

import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT

LAYERS = 4
CALIB = ["--calib-samples", "2", "--calib-seq-len", "64"]


@pytest.fixture(scope="module")
def four_layers(tmp_path_factory, default_model):
    """SmolLM2-135M's real weights cut to its first four blocks, as an HF folder (an export of ~1 s a block)."""
    from safetensors.torch import save_file
    folder = tmp_path_factory.mktemp("smollm2-4")
    keep = {k: v.contiguous() for k, v in default_model.tensors.items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < LAYERS}
    save_file(keep, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(dict(default_model.hf_config, num_hidden_layers=LAYERS)))
    for f in default_model.tokenizer_files():
        shutil.copyfile(f, folder / f.name)
    return folder


def _export(model: Path, out: Path, *extra, preexec=None, wait=True):
    cmd = [sys.executable, "scripts/export.py", "--model", str(model), "--out", str(out), *CALIB, "--json", *extra]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=preexec, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    if not wait:
        return p
    out_, err = p.communicate(timeout=900)
    return p.returncode, out_, err


def _digests(folder: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def uninterrupted(four_layers, tmp_path_factory):
    out = tmp_path_factory.mktemp("whole") / "ckpt"
    rc, stdout, err = _export(four_layers, out)
    assert rc == 0, err
    return out, json.loads(stdout.strip().splitlines()[-1])


def _progress(out: Path) -> dict:
    try:
        return json.loads((out.parent / f".{out.name}.partial" / "progress.json").read_text())
    except (OSError, ValueError):
        return {}


def test_sigkill_mid_block_resumes_there_with_identical_bytes(four_layers, uninterrupted, tmp_path):
    out = tmp_path / "ckpt"
    p = _export(four_layers, out, wait=False)
    deadline = time.time() + 600
    while "layer-001" not in _progress(out).get("stages", {}):           # killed while block 2 is under way
        assert p.poll() is None and time.time() < deadline, "the export ended before block 1 was committed"
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()
    done = list(_progress(out)["stages"])
    assert done[:3] == ["embed", "layer-000", "layer-001"] and "head" not in done, done
    assert not out.exists()                                              # nothing half-written at --out
    rc, stdout, err = _export(four_layers, out)
    assert rc == 0, err
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["resumed_stages"] == len(done)
    assert len(summary["seconds_per_layer"]) == LAYERS - (len(done) - 1)  # the finished blocks were not redone
    assert _digests(out) == _digests(uninterrupted[0])                   # every file, manifest included
    assert not (out.parent / f".{out.name}.partial").exists()


def test_file_size_limit_mid_shard_keeps_finished_stages(four_layers, uninterrupted, tmp_path):
    out = tmp_path / "ckpt"

    def limit():                                   # the head's shard (28 MB) cannot be written, the blocks' (3.6 MB) can
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8 << 20, 8 << 20))
    rc, stdout, err = _export(four_layers, out, preexec=limit)
    assert rc != 0 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("bitnest-export:")]
    assert len(lines) == 1 and "head.safetensors" in lines[0] and "finished layers are kept" in lines[0], err
    assert list(_progress(out)["stages"]) == ["embed"] + [f"layer-{i:03d}" for i in range(LAYERS)]
    rc, stdout, err = _export(four_layers, out)
    assert rc == 0, err
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["resumed_stages"] == LAYERS + 1 and summary["seconds_per_layer"] == []
    assert _digests(out) == _digests(uninterrupted[0])


def test_plan_past_available_memory_is_refused_before_any_work(four_layers, tmp_path):
    out = tmp_path / "ckpt"
    cmd = [sys.executable, "scripts/export.py", "--model", str(four_layers), "--out", str(out),
           "--calib-samples", "400000", "--calib-seq-len", "512"]       # streams alone: 400,000 x 512 x 576 x 4 B
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    line = [x for x in r.stderr.splitlines() if x.startswith("bitnest-export:")]
    assert len(line) == 1 and "--calib-samples" in line[0] and "available" in line[0], r.stderr
    assert not out.exists() and not (tmp_path / ".ckpt.partial").exists()


def test_summary_reports_memory_and_time_per_block(uninterrupted):
    out, s = uninterrupted
    assert len(s["seconds_per_layer"]) == LAYERS and all(t > 0 for t in s["seconds_per_layer"])
    mem = s["memory"]
    assert 0 < mem["measured_peak"] and mem["planned_peak"] == mem["plan"]["peak"]
    assert mem["plan"]["streams"] == 2 * 64 * 576 * 4                   # one view: samples x tokens x hidden x 4 B
    files = json.loads((out / "manifest.json").read_text())["files"]
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert set(index.values()) == {"embed.safetensors", "head.safetensors"} | {f"layer-{i:03d}.safetensors"
                                                                               for i in range(LAYERS)}
    assert set(index.values()) <= set(files) and "model.safetensors.index.json" in files


def test_a_changed_shard_fails_the_seal(uninterrupted, tmp_path):
    from edge.errors import CheckpointError
    from edge.model.checkpoint import load_checkpoint
    bad = tmp_path / "bad"
    shutil.copytree(uninterrupted[0], bad)
    f = bad / "layer-002.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="layer-002.safetensors fails its sha256"):
        load_checkpoint(bad)
    assert torch.equal(load_checkpoint(uninterrupted[0]).tensors["lm_head.base"],
                       load_checkpoint(uninterrupted[0], weights="base").tensors["lm_head.base"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where torch sees no CUDA GPU")
def test_device_cuda_without_a_gpu_is_one_line_before_any_work(four_layers, tmp_path):
    out = tmp_path / "ckpt"
    rc, stdout, err = _export(four_layers, out, "--device", "cuda")
    assert rc != 0 and "Traceback" not in err, err
    lines = [x for x in err.splitlines() if x.startswith("bitnest-export:")]
    assert len(lines) == 1 and "--device cuda" in lines[0] and "--device cpu" in lines[0], err
    assert not out.exists() and not (tmp_path / ".ckpt.partial").exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_cuda_export_matches_the_cpu_codes(four_layers, uninterrupted, tmp_path):
    """GPTQ and the calibration passes on CUDA: float32 sums in another order may move a code by one step where a
    value sits on a rounding edge, so the composed 8-bit codes agree on nearly every weight, not all."""
    from edge.model.checkpoint import load_checkpoint
    from plugins.packing import unpack_nibbles
    codes = lambda t, n: 16 * unpack_nibbles(t[n + ".base"]).int() + unpack_nibbles(t[n + ".refine"]).int()
    out = tmp_path / "ckpt"
    rc, stdout, err = _export(four_layers, out, "--device", "cuda")
    assert rc == 0, err
    gpu, cpu = load_checkpoint(out), load_checkpoint(uninterrupted[0])
    for name in cpu.linears:
        a, b = codes(cpu.tensors, name), codes(gpu.tensors, name)                   # [N, K] 8-bit codes
        same = (a == b).float().mean().item()
        assert same > 0.99 and (a - b).abs().float().mean().item() < 0.05, (name, same)


def test_a_resume_drops_what_the_progress_does_not_list(tmp_path):
    """A kill after progress.json named a stage's new streams file but before the previous one was removed (and one
    in the middle of an unfinished stage's shard): the resumed folder holds only what the progress lists, as an
    uninterrupted export's does at that point (the sealed checkpoint is assembled from the folder as a whole)."""
    from export.workdir import WorkFolder
    job = {"model": "x"}
    wd = WorkFolder(tmp_path / "w", job)
    wd.open()
    x = lambda v: {"x": torch.full((2, 3), float(v))}
    wd.commit("embed", {"embed.safetensors": x(0)}, streams={"draft": torch.zeros(1, 2)})
    wd.commit("layer-000", {"layer-000.safetensors": x(1)}, streams={"draft": torch.ones(1, 2)})
    shutil.copyfile(wd.path / "layer-000.safetensors", wd.path / "streams-embed.safetensors")   # the old streams left
    (wd.path / "layer-001.safetensors.tmp").write_bytes(b"half")                               # an unfinished shard
    again = WorkFolder(tmp_path / "w", job)
    assert again.open() == ["embed", "layer-000"]
    assert sorted(f.name for f in again.path.iterdir()) == ["embed.safetensors", "job.json", "layer-000.safetensors",
                                                            "progress.json", "streams-layer-000.safetensors"]
    assert torch.equal(again.streams()["draft"], torch.ones(1, 2))
