"""Reader of an HF model folder (config.json + *.safetensors + tokenizer files) as float32 tensors:
the float reference that exports start from and that evaluation compares against."""

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from edge.errors import BitNestError
from edge.model.arch import ModelConfig, config_from_hf

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json", "tokenizer.model", "vocab.json", "merges.txt")


@dataclass
class LoadedModel:
    """Float weights of a source model: HF config dict, typed config, tensors (float32) and its folder."""

    spec: str
    hf_config: dict
    config: ModelConfig
    tensors: dict[str, torch.Tensor]
    folder: Path

    def tokenizer_files(self) -> list[Path]:
        return [self.folder / f for f in TOKENIZER_FILES if (self.folder / f).is_file()]


def load_hf_folder(folder: Path, spec: str) -> LoadedModel:
    """Read config.json and every *.safetensors file of an HF folder as float32 tensors."""
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise BitNestError(f"{folder} has no config.json: pass an HF model folder, a .gguf file or `default`")
    try:
        hf = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise BitNestError(f"{cfg_path} is not valid JSON ({e})") from None
    config = config_from_hf(hf)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise BitNestError(f"{folder} has no *.safetensors weights: convert the model to safetensors first")
    tensors = {}
    for f in files:
        tensors.update({k: v.float() for k, v in load_file(str(f)).items()})
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    return LoadedModel(spec, hf, config, tensors, folder)
