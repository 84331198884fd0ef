"""The nested checkpoint's manifest and files (docs/contracts.md, weights): the manifest's fields checked and its
seal, the files it seals and their digests, which files hold the tensors. edge.model.checkpoint reads the tensors."""

import hashlib
import json
from pathlib import Path
from typing import Any

from edge.errors import CheckpointError
from edge.model.tensor_file import sha256_mismatch
from plugins.contracts import FORMAT_VERSION

FORMAT_NAME = "bitnest-nested"
MANIFEST = "manifest.json"
WEIGHTS = "model.safetensors"            # format version 1: every tensor in this one file
INDEX = "model.safetensors.index.json"   # format version 2: tensor -> shard (HF's index layout), shards beside it
READ_VERSIONS = (1, FORMAT_VERSION)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


SEAL = "manifest_sha256"
MANIFEST_FIELDS = {"format", "format_version", "config", "method", "refine", "quant", "head", "embedding", "draft_head",
                   "shortlist_k", "draft_vocab", "linears", "rotation", "calibration", "source", "activations",
                   "export", "files", "tokenizer_files", SEAL}


def manifest_seal(m: dict[str, Any]) -> str:
    """sha256 of the manifest's content without its seal (canonical JSON): the manifest is not in its own file list,
    so the seal is what detects a manifest changed after export (a silently different config or rotation)."""
    body = {k: v for k, v in m.items() if k != SEAL}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def is_checkpoint_dir(path: Path) -> bool:
    """True where `path` holds a manifest that says it is a BitNest checkpoint (contents not validated)."""
    try:
        return json.loads((Path(path) / MANIFEST).read_text()).get("format") == FORMAT_NAME
    except (OSError, ValueError, AttributeError):
        return False


def read_manifest(path: Path) -> dict[str, Any]:
    """Parse and check the manifest's top-level fields; CheckpointError with a fix on any problem."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist: export one with `python scripts/export.py --out {path}`")
    mpath = path / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(f"{path} is not a BitNest checkpoint (no {MANIFEST}): export one with scripts/export.py")
    try:
        m = json.loads(mpath.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{mpath} is not valid JSON ({e.__class__.__name__}): the checkpoint is corrupted, re-export it")
    if not isinstance(m, dict) or m.get("format") != FORMAT_NAME:
        raise CheckpointError(f"{mpath} is not a {FORMAT_NAME} manifest: re-export the checkpoint")
    version = m.get("format_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION:
        raise CheckpointError(f"{path} has format version {version}, made by a newer bitnest-edge; this one reads "
                              f"versions {', '.join(map(str, READ_VERSIONS))}: upgrade bitnest-edge")
    if version not in READ_VERSIONS:
        raise CheckpointError(f"{path} has format version {version!r}, this runtime reads "
                              f"{', '.join(map(str, READ_VERSIONS))}: re-export it")
    for key in ("config", "method", "linears", "files", "rotation"):
        if key not in m:
            raise CheckpointError(f"{mpath} lacks the field {key!r}: the checkpoint is corrupted, re-export it")
    unknown = sorted(set(m) - MANIFEST_FIELDS)
    if unknown:
        raise CheckpointError(f"{mpath} has unknown fields ({', '.join(map(str, unknown))[:120]}): the checkpoint "
                              "is corrupted or from another format version, re-export it")
    kinds = {"config": dict, "linears": dict, "files": dict, "rotation": dict, "method": str}
    bad = [k for k, t in kinds.items() if not isinstance(m[k], t)] + \
        [f"files[{n!r}]" for n, d in m["files"].items() if not (isinstance(d, str) and len(d) == 64)] + \
        [f"files[{n!r}]" for n in m["files"] if "/" in n or "\\" in n or n in ("", ".", "..")]
    if bad:
        raise CheckpointError(f"{mpath}: malformed field {bad[0]}: the checkpoint is corrupted, re-export it")
    if SEAL in m and m[SEAL] != manifest_seal(m):
        raise CheckpointError(f"{mpath} was changed after export (it fails its own sha256): re-export the checkpoint")
    return m


def verify_files(path: Path, manifest: dict[str, Any], skip: tuple[str, ...] = ()) -> None:
    """Every file the manifest lists exists and matches its sha256 (the files in `skip`: exist only)."""
    for name, digest in manifest["files"].items():
        f = path / name
        if not f.is_file():
            raise CheckpointError(f"checkpoint {path} is missing {name}: re-export it")
        if name not in skip and sha256_file(f) != digest:
            raise sha256_mismatch(f)


def weight_files(path: Path, m: dict[str, Any]) -> list[str]:
    """The files holding the tensors: model.safetensors (version 1), or the shards the index names (version 2; the
    index itself is sealed by the manifest's `files`)."""
    if m.get("format_version") == 1:
        return [WEIGHTS]
    if not (path / INDEX).is_file():
        raise CheckpointError(f"checkpoint {path} is missing {INDEX}: re-export it")
    try:
        index = json.loads((path / INDEX).read_text())
        shards = list(dict.fromkeys(index["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise CheckpointError(f"{path}/{INDEX} is malformed: re-export the checkpoint") from None
    bad = [f for f in shards if not isinstance(f, str) or f not in m["files"]]
    if bad:
        raise CheckpointError(f"{path}/{INDEX} names {str(bad[0])[:80]}, which the manifest does not seal: "
                              "re-export the checkpoint")
    return shards


def weights_sha256(m: dict[str, Any]) -> str:
    """One digest of a checkpoint's weights (what a cache or an engine built from them is keyed by): the sha256 of
    model.safetensors (version 1), else of the sealed digests of the index and every shard."""
    files = m["files"]
    if WEIGHTS in files and m.get("format_version") == 1:
        return files[WEIGHTS]
    body = {n: d for n, d in files.items() if n == INDEX or n.endswith(".safetensors")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
