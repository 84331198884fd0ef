"""Nested checkpoint writer: planes, scales and float16 tensors into model.safetensors plus manifest.json,
built in a temporary folder and renamed into place, so a half-written checkpoint never loads."""

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from edge.errors import BitNestError
from edge.model.checkpoint import MANIFEST, SEAL, WEIGHTS, is_checkpoint_dir, manifest_seal, sha256_file
from plugins.nesting import NestedCodes
from plugins.packing import pack_nibbles


def check_output_dir(out: Path) -> None:
    """Refuse an existing folder unless it is empty or already a BitNest checkpoint (which is replaced)."""
    if out.exists() and not (out.is_dir() and (not any(out.iterdir()) or is_checkpoint_dir(out))):
        raise BitNestError(f"output {out} exists and is not a BitNest checkpoint: choose another --out or remove it")


def nested_tensors(codes: dict[str, NestedCodes]) -> dict[str, torch.Tensor]:
    """NAME.base / NAME.refine (uint8 [N, K/2]), NAME.scale (float16 [N, K/G]) and NAME.offset where present."""
    out = {}
    for name, c in codes.items():
        out[name + ".base"] = pack_nibbles(c.q4)
        out[name + ".refine"] = pack_nibbles(c.qr)
        out[name + ".scale"] = c.scale.to(torch.float16).contiguous()
        if c.offset is not None:
            out[name + ".offset"] = c.offset.to(torch.float16).contiguous()
    return out


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where that is unavailable."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        at_fdcwd, rename_exchange = -100, 2
        return libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0
    except (OSError, AttributeError):
        return False


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(out: Path, tensors: dict[str, torch.Tensor], manifest: dict, extra_files: list[Path]) -> Path:
    """Write tensors, copy `extra_files` (tokenizer), hash everything, write the sealed manifest last, then put the
    folder in place: an earlier checkpoint at `out` is swapped out in one atomic exchange where the OS has one, so a
    kill at any moment leaves either it or the new one at `out`, never neither. A failed write (a full disk) leaves
    `out` untouched and is a one-line error."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    out = Path(out)
    check_output_dir(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / WEIGHTS))
        for f in extra_files:
            shutil.copyfile(f, tmp / f.name)
        files = [WEIGHTS] + [f.name for f in extra_files]
        for name in files:
            _fsync(tmp / name)
        manifest = dict(manifest, files={name: sha256_file(tmp / name) for name in files},
                        tokenizer_files=[f.name for f in extra_files])
        manifest[SEAL] = manifest_seal(manifest)
        with open(tmp / MANIFEST, "w") as fh:
            json.dump(manifest, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync(tmp)
        if out.exists() and _exchange(tmp, out):
            shutil.rmtree(tmp, ignore_errors=True)          # tmp now holds the earlier checkpoint
        else:
            old = None
            if out.exists():
                old = out.with_name(f".{out.name}.old-{os.getpid()}")
                os.replace(out, old)
            os.replace(tmp, out)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        _fsync(out.parent)
    except (OSError, SafetensorError) as e:     # safetensors reports a full disk as its own error type
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).strip().splitlines()[-1][-120:]
        raise BitNestError(f"writing the checkpoint to {out} failed ({why}); any earlier checkpoint there is "
                           "untouched") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out
