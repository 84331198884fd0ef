"""Nested checkpoint assembly: the finished shards of an export's work folder, their index, the tokenizer files and
the sealed manifest (written last), the folder then renamed into place, so a half-written checkpoint never loads."""

import json
import os
import shutil
from pathlib import Path

from edge.errors import BitNestError
from edge.model.manifest import INDEX, MANIFEST, SEAL, is_checkpoint_dir, manifest_seal, sha256_file
from edge.model.tensor_file import read_header
from export.shard_writer import fsync_path


def check_output_dir(out: Path) -> None:
    """Refuse an existing folder unless it is empty or already a BitNest checkpoint (which is replaced)."""
    if out.exists() and not (out.is_dir() and (not any(out.iterdir()) or is_checkpoint_dir(out))):
        raise BitNestError(f"output {out} exists and is not a BitNest checkpoint: choose another --out or remove it")


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux renameat2 RENAME_EXCHANGE); False where that is unavailable."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        at_fdcwd, rename_exchange = -100, 2
        return libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0
    except (OSError, AttributeError):
        return False


def _place(tmp: Path, out: Path) -> None:
    """Put the finished folder `tmp` at `out`: an earlier checkpoint there is swapped out in one atomic exchange where
    the OS has one, so a kill at any moment leaves either it or the new one at `out`, never neither."""
    fsync_path(tmp)
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
    fsync_path(out.parent)


def assemble_checkpoint(work: Path, out: Path, shards: dict[str, str], manifest: dict, extra_files: list[Path],
                        drop: tuple[str, ...] = ()) -> Path:
    """Finish the export in its work folder (`shards`: the finished shards, file name -> sha256, in stage order):
    copy `extra_files` (tokenizer), write the index (tensor -> shard) and the sealed manifest last (its `files` hold
    every shard's, the index's and the tokenizer files' sha256), remove the work files `drop`, then put the folder at
    `out`. A failed write (a full
    disk) leaves `out` and the finished shards untouched and is a one-line error."""
    out, work = Path(out), Path(work)
    check_output_dir(out)
    try:
        weight_map, total = {}, 0
        for name in shards:
            with open(work / name, "rb") as f:
                entries, _ = read_header(f, work / name)
            for tensor, (_, _, begin, end) in entries.items():
                weight_map[tensor] = name
                total += end - begin
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        with open(work / INDEX, "w") as fh:
            json.dump(index, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        for f in extra_files:
            shutil.copyfile(f, work / f.name)
            fsync_path(work / f.name)
        files = dict(shards)
        for name in [INDEX] + [f.name for f in extra_files]:
            files[name] = sha256_file(work / name)
        manifest = dict(manifest, files=files, tokenizer_files=[f.name for f in extra_files])
        manifest[SEAL] = manifest_seal(manifest)
        with open(work / MANIFEST, "w") as fh:
            json.dump(manifest, fh, indent=1)
            fh.flush()
            os.fsync(fh.fileno())
        for name in drop:
            (work / name).unlink(missing_ok=True)
        _place(work, out)
    except OSError as e:
        raise BitNestError(f"writing the checkpoint to {out} failed ({e.strerror or e}); any earlier checkpoint there "
                           f"is untouched and the finished stages are kept in {work}: run the same command again") from None
    return out
