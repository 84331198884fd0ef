"""Prompts files: JSONL, one {"prompt": str, "chat": bool} per line, read with a one-line error per defect."""

import json
from pathlib import Path

from edge.errors import BitNestError


def read_prompts(path: str) -> list[tuple[str, bool]]:
    """[(prompt, chat)] from a JSONL file; a malformed line is a one-line error naming it."""
    f = Path(path)
    if not f.is_file():
        raise BitNestError(f"prompts file {path} does not exist")
    try:
        text = f.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise BitNestError(f"{path} is not UTF-8 text (byte {e.start})") from None
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        # a string prompt and, where given, a true/false chat flag: nothing is coerced ("false" is not false)
        if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str) or \
                not isinstance(rec.get("chat", True), bool):
            raise BitNestError(f"{path}:{i}: expected a JSON object with a \"prompt\" string (and a true/false "
                               "\"chat\")")
        out.append((rec["prompt"], rec.get("chat", True)))
    if not out:
        raise BitNestError(f"prompts file {path} holds no prompts")
    return out
