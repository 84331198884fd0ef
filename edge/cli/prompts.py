"""Prompts files: JSONL, one {"prompt": str, "chat": bool} per line, read with a one-line error per defect."""

import json
from pathlib import Path

from edge.errors import BitNestError


def read_prompts(path: str) -> list[tuple[str, bool]]:
    """[(prompt, chat)] from a JSONL file; a malformed line is a one-line error naming it."""
    f = Path(path)
    if not f.is_file():
        raise BitNestError(f"prompts file {path} does not exist")
    out = []
    for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            out.append((str(rec["prompt"]), bool(rec.get("chat", True))))
        except (ValueError, KeyError, TypeError):
            raise BitNestError(f"{path}:{i}: expected a JSON object with a \"prompt\" string") from None
    if not out:
        raise BitNestError(f"prompts file {path} holds no prompts")
    return out
