"""The export's work folder: finished stages (the embedding, each block, the head) as shards with their sha256 and the
calibration streams after the last finished block, committed in an order that survives a kill at any moment, so the
same command resumes at the first unfinished stage and ends with the bytes an uninterrupted export writes."""

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Optional

import torch

from edge.model.manifest import sha256_file
from edge.model.tensor_file import read_tensors
from export.shard_writer import fsync_path, write_shard

JOB = "job.json"
PROGRESS = "progress.json"


def work_folder(out: Path) -> Path:
    """Where an export to `out` keeps its finished stages until it is complete: beside `out`, hidden."""
    return out.parent / f".{out.name}.partial"


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(obj, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


class WorkFolder:
    """Stages of one export job (`job`: what makes two runs the same export: options and source) in `path`.

    Commit order of a stage: its shards (each renamed into place whole), the streams file of that stage (a new name,
    never overwritten), then progress.json (renamed into place): a kill before the last step leaves the stage
    unfinished and its files unlisted, and the next run writes them again."""

    def __init__(self, path: Path, job: dict):
        self.path = Path(path)
        self.job = job
        self.digest = hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()
        self.progress: dict = {"stages": {}, "streams": None}
        self.resumed: list[str] = []

    def open(self) -> list[str]:
        """Create the folder, or take up the finished stages of the same job (an earlier job's folder, or one whose
        files fail their sha256, is started over); the names of the stages taken up."""
        if self.path.is_dir():
            try:
                same = json.loads((self.path / JOB).read_text()).get("digest") == self.digest
                progress = json.loads((self.path / PROGRESS).read_text()) if same else None
            except (OSError, ValueError):
                same, progress = False, None
            if same and progress is not None and self._intact(progress):
                self.progress = progress
                self.resumed = list(progress["stages"])
                self._drop_unlisted()
                return self.resumed
            if same and progress is None:
                return []
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True)
        _write_json(self.path / JOB, {"digest": self.digest, "job": self.job})
        return []

    def _drop_unlisted(self) -> None:
        """Remove what the progress does not list: the previous streams file where a kill came between the progress
        write and its removal, an unfinished stage's shards (temporary or renamed in before the kill). What is left
        is what an uninterrupted export has at that point, so the folder assembled from it is byte for byte the
        same."""
        keep = {JOB, PROGRESS} | set(self.files())
        if self.progress.get("streams"):
            keep.add(self.progress["streams"][0])
        for f in self.path.iterdir():
            if f.name not in keep:
                shutil.rmtree(f) if f.is_dir() else f.unlink(missing_ok=True)

    def _intact(self, progress: dict) -> bool:
        files = [f for stage in progress.get("stages", {}).values() for f in stage.items()]
        if progress.get("streams"):
            files.append(tuple(progress["streams"]))
        return all((self.path / name).is_file() and sha256_file(self.path / name) == digest for name, digest in files)

    def done(self, stage: str) -> bool:
        return stage in self.progress["stages"]

    def files(self) -> dict[str, str]:
        """Every finished stage's shard name -> sha256, in stage order."""
        return {name: d for stage in self.progress["stages"].values() for name, d in stage.items()}

    def commit(self, stage: str, shards: dict[str, dict[str, torch.Tensor]],
               streams: Optional[dict[str, torch.Tensor]] = None, written: Optional[dict[str, str]] = None) -> None:
        """Finish `stage`: write `shards` (file name -> tensors), and the streams after it where given; `written`:
        shards already written by the caller (streamed rows), file name -> sha256."""
        files = dict(written or {})
        for name, tensors in shards.items():
            files[name] = write_shard(self.path / name, tensors)
        old = self.progress.get("streams")
        if streams is not None:
            sname = f"streams-{stage}.safetensors"
            self.progress["streams"] = [sname, write_shard(self.path / sname, streams)]
        self.progress["stages"][stage] = files
        _write_json(self.path / PROGRESS, self.progress)
        if streams is not None and old and old[0] != self.progress["streams"][0]:
            (self.path / old[0]).unlink(missing_ok=True)

    def streams(self) -> dict[str, torch.Tensor]:
        """The calibration streams the last finished stage left ({} where none was saved)."""
        if not self.progress.get("streams"):
            return {}
        tensors, _ = read_tensors(self.path / self.progress["streams"][0], lambda n: True)
        return tensors

    def drop_streams(self) -> None:
        """The streams are no longer needed (the checkpoint is assembled): remove their file."""
        if self.progress.get("streams"):
            (self.path / self.progress["streams"][0]).unlink(missing_ok=True)
            self.progress["streams"] = None
            _write_json(self.path / PROGRESS, self.progress)
