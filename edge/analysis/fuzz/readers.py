"""The readers under fuzz (edge.analysis.fuzz.mutations), each with its mutations and its own oracle: what a correct reader
must return for the mutated input, computed here without the reader's code."""

import json
import math
import random
import re
import shutil
from pathlib import Path

import numpy as np

from edge.analysis.fuzz.mutations import JUNK, Tally, attempt, case_dir, json_text, mutate_bytes, quiet, write_text
from edge.analysis.fuzz.oracle import checkpoint_differs, expected_tensors, parse_safetensors
from edge.model.checkpoint import load_checkpoint
from edge.model.manifest import MANIFEST, SEAL, manifest_seal, sha256_file, weight_files, weights_sha256
from plugins.step_contract import ONNX_FILE


def _canon(m) -> str:
    """A manifest's content without its seal, as canonical JSON (types kept apart: 1, 1.0 and true differ)."""
    return json.dumps({k: v for k, v in m.items() if k != SEAL}, sort_keys=True)


def _manifest_verdict(written, original: dict, resealed: bool) -> bool | None:
    """Must a correct reader load (True) or refuse (False) this manifest, or may it do either (None)? The content
    as exported, with its seal or none (an unsealed manifest loads, as one exported before seals): load. Content
    changed, seal kept: refuse. Content changed and re-sealed (an edit that recomputes the seal), or the seal
    dropped by the change: either, and a load must hold what the manifest says."""
    if not isinstance(written, dict):
        return False
    if _canon(written) == _canon(original):
        return written.get(SEAL, original[SEAL]) == original[SEAL]
    return None if resealed or SEAL not in written else False


def _weight_files(base: Path) -> tuple[str, dict]:
    """The weight file these cases mutate (the one file of format 1, the first shard the index names in format 2)
    and the tensors of every other weight file (a load returns them unchanged)."""
    names = weight_files(base, json.loads((base / MANIFEST).read_text()))
    others = {k: v for name in names[1:] for k, v in parse_safetensors((base / name).read_bytes()).items()}
    return names[0], others


def fuzz_manifest(base: Path, work: Path, n: int, rng: random.Random, seconds: float) -> Tally:
    """Mutated manifest.json, half of the cases re-sealed, one in ten only re-formatted (indent, key order: it
    must load). The oracle (_manifest_verdict, and the weights parsed apart from the reader) says what must load
    or be refused; a load must return the manifest written, its config and linears, and the file's tensors."""
    t = Tally()
    original = json.loads((base / MANIFEST).read_text())
    name, others = _weight_files(base)
    tensors = {**parse_safetensors((base / name).read_bytes()), **others}   # the weights, untouched by these cases
    for i in range(n):
        d = case_dir(base, work, (MANIFEST,))
        if i % 10 == 4:
            text = json.dumps(original, indent=rng.choice((None, 1, 4)), sort_keys=rng.random() < 0.5)
        else:
            text = json_text(rng, original)
        resealed = i % 2 == 1
        if resealed:
            try:
                m = json.loads(text)
                if isinstance(m, dict):
                    m[SEAL] = manifest_seal(m)
                    text = json.dumps(m)
            except ValueError:
                pass
        write_text(d / MANIFEST, text)
        try:
            written = json.loads(text)
        except ValueError:
            written = None
        valid = _manifest_verdict(written, original, resealed)
        with quiet():
            attempt(t, f"manifest case {i}", lambda: load_checkpoint(d),
                    lambda ck: checkpoint_differs(ck, written, tensors) or True, seconds, valid)
    return t


def fuzz_weights(base: Path, work: Path, n: int, rng: random.Random, seconds: float) -> Tally:
    """A mutated weight file (model.safetensors, or the first shard): one bit of a tensor flipped, the header rewritten (entries in another order,
    another layout), or a mutation of its JSON header most of the time, else anywhere. Half keep the exported sha256:
    only the unchanged file loads. Half are re-hashed and re-sealed: the oracle (edge.analysis.fuzz.oracle) parses
    the bytes itself and says whether they must load (safetensors, every exported tensor with its dtype and shape)
    and what a load must return, byte for byte; a refusal of what it calls valid counts against the reader."""
    t = Tally()
    shard, others = _weight_files(base)
    data = (base / shard).read_bytes()
    exported = parse_safetensors(data)
    header = 8 + int.from_bytes(data[:8], "little")
    manifest = json.loads((base / MANIFEST).read_text())
    for i in range(n):
        d = case_dir(base, work, (shard, MANIFEST))
        kind = (i // 2) % 5                          # each kind both re-hashed and not
        if kind == 0:                                # tensor bytes changed, the file well-formed: loads what it holds
            at = rng.randrange(header, len(data))
            new = data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1:]
        elif kind == 1:                              # the same header written another way: loads as exported
            head = list(json.loads(data[8:header]).items())
            rng.shuffle(head)
            raw = json.dumps(dict(head), indent=rng.choice((None, 1))).encode()
            new = len(raw).to_bytes(8, "little") + raw + data[header:]
        elif rng.random() < 0.4:                     # a well-formed header with one field changed
            head = json.loads(data[8:header])
            head = {k: v for k, v in head.items()}
            body = json.dumps(json.loads(json.dumps(head)) if rng.random() < 0.1 else _mutate_header(rng, head))
            raw = body.encode()
            new = len(raw).to_bytes(8, "little") + raw + data[header:]
        else:
            new = mutate_bytes(rng, data, header + 64 if rng.random() < 0.7 else None)
        (d / shard).write_bytes(new)
        rehashed = i % 2 == 1
        m = json.loads(json.dumps(manifest))
        if rehashed:
            m["files"][shard] = sha256_file(d / shard)
            m[SEAL] = manifest_seal(m)
            want, valid = expected_tensors(new, exported)
        else:
            want, valid = (exported, True) if new == data else (None, False)
        want = None if want is None else {**others, **want}
        (d / MANIFEST).write_text(json.dumps(m))
        with quiet():
            attempt(t, f"weights case {i}", lambda: load_checkpoint(d),
                    lambda ck: checkpoint_differs(ck, m, want) or True, seconds, valid)
    return t


def _mutate_header(rng: random.Random, head: dict) -> dict:
    name = rng.choice([k for k in head if k != "__metadata__"])
    entry = dict(head[name])
    field = rng.choice(("dtype", "shape", "data_offsets", "name", "delete"))
    if field == "delete":
        head.pop(name)
    elif field == "name":
        head[name + "x"] = head.pop(name)
    elif field == "dtype":
        entry["dtype"] = rng.choice(("F32", "U8", "I8", "F16", "BF16", "F64", "BOOL", "X", 3))
        head[name] = entry
    elif field == "shape":
        shape = list(entry["shape"])
        entry["shape"] = rng.choice((shape[::-1], shape + [1], shape[:1], [s * 2 for s in shape], [-1], [], "x"))
        head[name] = entry
    else:
        a, b = entry["data_offsets"]
        entry["data_offsets"] = rng.choice(([a, b + 2], [a + 1, b], [b, a], [0, 10 ** 15], [a], "x"))
        head[name] = entry
    return head


# -- prompts files -----------------------------------------------------------------------------------------------
PROMPT_LINES = [{"prompt": "Name three rivers.", "chat": True}, {"prompt": "To be, or not to be,", "chat": False},
                {"prompt": "Say hi."}]


def _expected_prompts(text: bytes):
    """What a correct reader returns for this file: [(prompt, chat)], or None where it must refuse the file."""
    try:
        lines = text.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return None
    out = []
    for line in lines:
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            return None
        if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str) or \
                not isinstance(rec.get("chat", True), bool):
            return None
        out.append((rec["prompt"], rec.get("chat", True)))
    return out or None


def fuzz_prompts(work: Path, n: int, rng: random.Random, seconds: float) -> Tally:
    from edge.options.prompts import read_prompts
    t = Tally()
    f = work / "prompts.jsonl"
    for i in range(n):
        lines = [json.dumps(rng.choice(PROMPT_LINES)) for _ in range(rng.randint(0, 4))]
        j = rng.randrange(len(lines)) if lines else 0
        if lines and rng.random() < 0.8:
            lines[j] = json_text(rng, json.loads(lines[j]))
        else:
            lines.insert(j, rng.choice(["", "   ", "\ufeff{}", "[]", "null", '{"prompt": "a"} trailing', "\x00"]))
        raw = "\n".join(lines).encode("utf-8", errors="surrogateescape")
        if rng.random() < 0.2:
            raw = mutate_bytes(rng, raw)
        f.write_bytes(raw)
        want = _expected_prompts(raw)
        attempt(t, f"prompts case {i}: {raw[:80]!r}", lambda: read_prompts(str(f)), lambda got: got == want, seconds,
                want is not None)
    return t


# -- gate thresholds ---------------------------------------------------------------------------------------------
def fuzz_thresholds(base: Path, work: Path, n: int, rng: random.Random, seconds: float) -> Tally:
    """Mutated thresholds file beside a checkpoint, read the way a gate policy reads it (resolve_gate)."""
    from edge.decode.config import GateConfig
    from edge.decode.thresholds import FORMAT, THRESHOLDS_FILE, resolve_gate
    t = Tally()
    d = case_dir(base, work, (THRESHOLDS_FILE,))
    ck = load_checkpoint(d)
    valid = {"format": FORMAT, "version": 1, "weights_sha256": weights_sha256(ck.manifest),
             "backends": {"cpu": {"backend": "cpu", "steps": 64, "entropy": {"0.15": 1.25, "0.3": 0.8},
                                  "margin": {"0.15": 2.5, "0.3": 4.0}}}}
    for i in range(n):
        text = json_text(rng, valid)
        write_text(d / THRESHOLDS_FILE, text)
        policy = rng.choice(("gate-entropy", "gate-margin"))

        def want() -> float | None:
            """The threshold a correct reader returns, None where it must refuse (or ignore the file)."""
            try:
                data = json.loads(text)
                table = data["backends"]["cpu"][policy.split("-")[1]]
                ok = data["format"] == FORMAT and data["weights_sha256"] == valid["weights_sha256"]
                v = table["0.15"] if ok else None
            except (ValueError, KeyError, TypeError, IndexError):
                return None
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None

        expected = want()
        attempt(t, f"thresholds case {i}: {text[:120]!r}",
                lambda: resolve_gate(ck, "cpu", policy, GateConfig(rate=0.15)).threshold,
                lambda got: got == expected, seconds, expected is not None)
    return t


# -- tegrastats lines --------------------------------------------------------------------------------------------
def _expected_mw(line: str) -> float | None:
    """What the documented format gives: a reading is a whitespace-separated token `NAME` (VDD_/VIN_/POM_ and
    capitals, digits, underscores), one space, and a token `NOW[mW]/AVG[mW]` of digits; a rail's first reading
    counts. VDD_IN's instant mW where present, else the sum of the rails, None without any."""
    parts = re.split(r"(\s+)", line)                       # tokens at even indices, separators between
    rails = {}
    for i in range(0, len(parts) - 2, 2):
        name, sep, value = parts[i], parts[i + 1], parts[i + 2]
        if sep != " " or not re.fullmatch(r"(VDD|VIN|POM)_[A-Z0-9_]+", name) or name in rails:
            continue
        halves = value.split("/")
        if len(halves) == 2 and all(re.fullmatch(r"\d+(mW)?", h) for h in halves):
            rails[name] = int(halves[0].removesuffix("mW"))
    if not rails:
        return None
    return float(rails["VDD_IN"]) if "VDD_IN" in rails else float(sum(rails.values()))


def fuzz_tegrastats(recorded: Path, n: int, rng: random.Random, seconds: float) -> Tally:
    from edge.energy.tegrastats import parse_line
    t = Tally()
    lines = [ln for ln in recorded.read_text().splitlines() if ln.strip()]
    for i in range(n):
        line = rng.choice(lines)
        for _ in range(rng.randint(1, 3)):
            if rng.random() < 0.5:
                line = mutate_bytes(rng, line.encode()).decode("utf-8", errors="replace")
            else:
                words = line.split(" ")
                j = rng.randrange(len(words))
                words[j] = rng.choice(["VDD_IN", "-5mW/3mW", "99999999999999999999mW/1mW", "12mW", "mW/mW", "",
                                       "VDD_IN 1/2", "NaNmW/NaNmW", str(rng.randint(0, 10 ** 6)) + "mW/0mW"])
                line = " ".join(words)
        expected = _expected_mw(line)

        def read(line=line):
            p = parse_line(line)
            return None if p is None else p.total_mw()[0]
        attempt(t, f"tegrastats case {i}: {line[-160:]!r}", read, lambda got: got == expected, seconds,
                True if expected is not None else None)
    return t


# -- the ONNX step graph ------------------------------------------------------------------------------------------
def fuzz_onnx(base: Path, work: Path, n: int, rng: random.Random, seconds: float) -> Tally:
    """Mutated decoder_step.onnx beside its checkpoint, opened and run for one pass by the onnxruntime backend:
    it must refuse, or compute exactly what the exported graph computes."""
    import onnx

    from edge.backends import make_engine
    t = Tally()
    data = (base / ONNX_FILE).read_bytes()
    ids = [1, 504, 3145]
    with quiet():
        want = make_engine("onnxruntime", load_checkpoint(base), 8).prefill(ids).numpy()
    model = onnx.load_from_string(data)
    for i in range(n):
        d = case_dir(base, work, (ONNX_FILE,))
        if rng.random() < 0.5:
            new = mutate_bytes(rng, data, rng.choice((None, 4096)))
        else:
            m = onnx.ModelProto()
            m.CopyFrom(model)
            _mutate_graph(rng, m)
            new = m.SerializeToString()
        (d / ONNX_FILE).write_bytes(new)

        def run():
            return make_engine("onnxruntime", load_checkpoint(d), 8).prefill(ids).numpy()
        with quiet():
            attempt(t, f"onnx case {i}", run, lambda got: new == data or np.array_equal(got, want), seconds,
                    True if new == data else None)
    return t


def _mutate_graph(rng: random.Random, m) -> None:
    g = m.graph
    op = rng.choice(("drop_node", "rename_input", "init_dims", "init_bytes", "attr", "opset", "output"))
    if op == "drop_node" and g.node:
        del g.node[rng.randrange(len(g.node))]
    elif op == "rename_input" and g.node:
        node = g.node[rng.randrange(len(g.node))]
        if node.input:
            node.input[rng.randrange(len(node.input))] = rng.choice(["", "nope", g.input[0].name])
    elif op == "init_dims" and g.initializer:
        init = g.initializer[rng.randrange(len(g.initializer))]
        if init.dims:
            init.dims[0] = max(1, init.dims[0] + rng.choice((-1, 1)))
    elif op == "init_bytes" and g.initializer:
        init = g.initializer[rng.randrange(len(g.initializer))]
        if init.raw_data:
            raw = bytearray(init.raw_data)
            raw[rng.randrange(len(raw))] ^= 0x10
            init.raw_data = bytes(raw)
    elif op == "attr" and g.node:
        node = g.node[rng.randrange(len(g.node))]
        if node.attribute:
            a = node.attribute[rng.randrange(len(node.attribute))]
            a.i = rng.choice((-1, 0, 7, 10 ** 9))
    elif op == "opset":
        m.opset_import[0].version = rng.choice((1, 9, 99))
    elif g.output:
        g.output[rng.randrange(len(g.output))].name = "missing"


def fuzz_copy(base: Path, work: Path) -> Path:
    """A private copy of `base` to mutate, its manifest sealed: a checkpoint exported before manifests carried a
    seal loads unsealed, and mutating an unsealed manifest would test nothing the reader promises."""
    out = work / "base"
    if not out.exists():
        shutil.copytree(base, out, ignore=shutil.ignore_patterns(ONNX_FILE + "*"))
        m = json.loads((out / MANIFEST).read_text())
        if SEAL not in m:
            m[SEAL] = manifest_seal(m)
            write_text(out / MANIFEST, json.dumps(m, indent=1))
    return out


__all__ = ["fuzz_manifest", "fuzz_weights", "fuzz_prompts", "fuzz_thresholds", "fuzz_tegrastats", "fuzz_onnx",
           "JUNK", "fuzz_copy"]
