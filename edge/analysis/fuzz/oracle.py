"""The fuzzer's oracle for checkpoints (edge.analysis.fuzz.readers), written apart from the reader: a safetensors
file parsed from its bytes with struct and json by the format's rules (8-byte little-endian header length, a JSON
header, tensors laid end to end), what a correct load of a checkpoint must hold, and the comparison of a load with it.
Nothing here calls the safetensors package or edge.model.checkpoint's validation."""

import json
import math
import struct

import torch

MAX_HEADER = 100_000_000                     # the reference implementation refuses larger headers
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
               "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
TORCH_DTYPES = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "F8_E5M2": torch.float8_e5m2,
                "F8_E4M3": torch.float8_e4m3fn, "I16": torch.int16, "U16": torch.uint16, "F16": torch.float16,
                "BF16": torch.bfloat16, "I32": torch.int32, "U32": torch.uint32, "F32": torch.float32,
                "I64": torch.int64, "U64": torch.uint64, "F64": torch.float64}
U64 = 2 ** 64


class Invalid(Exception):
    """The bytes break the safetensors format (the message says where)."""


def _no_constant(name):
    raise Invalid(f"JSON has no {name}")


class Obj(list):
    """A JSON object as its (key, value) pairs, in order (duplicates kept: the rules differ by level)."""


def _fields(pairs: Obj, name: str) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise Invalid(f"{name}: a field given twice")
    return dict(pairs)


def _is_array(v) -> bool:
    return isinstance(v, list) and not isinstance(v, Obj)


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < U64


def parse_safetensors(data: bytes) -> dict[str, tuple[str, tuple[int, ...], bytes]]:
    """{name: (dtype, shape, raw bytes)} of a safetensors file, or Invalid. The rules: a u64 LE header length N,
    N <= 100 MB and 8 + N <= file size; the header UTF-8 strict JSON (no NaN / Infinity) holding an object; its
    `__metadata__`, if any, an object of strings; every other entry an object with a known `dtype`, a `shape` of
    non-negative integers and `data_offsets` [begin, end] of two; sorted by offsets, the tensors tile the data
    section from 0 to its end without gap or overlap, each exactly prod(shape) x dtype size bytes long. Of
    duplicate tensor names the last counts; duplicate fields inside one entry are an error."""
    if len(data) < 8:
        raise Invalid("shorter than its 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER or 8 + n > len(data):
        raise Invalid(f"header length {n} past the file or the 100 MB limit")
    try:
        text = data[8:8 + n].decode("utf-8")
    except UnicodeDecodeError:
        raise Invalid("header is not UTF-8") from None
    try:
        top = json.loads(text, parse_constant=_no_constant, object_pairs_hook=Obj)
    except ValueError:
        raise Invalid("header is not JSON") from None
    if not isinstance(top, Obj):
        raise Invalid("header is not an object")
    entries = dict(top)                          # of duplicate names the last counts
    meta = entries.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, Obj) and all(isinstance(v, str) for _, v in meta)):
        raise Invalid("__metadata__ is not an object of strings")
    infos = []
    for name, entry in entries.items():
        if not isinstance(entry, Obj):
            raise Invalid(f"{name}: not an object")
        e = _fields(entry, name)
        dtype, shape, offsets = e.get("dtype"), e.get("shape"), e.get("data_offsets")
        if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
            raise Invalid(f"{name}: unknown dtype {dtype!r}")
        if not _is_array(shape) or not all(_is_count(s) for s in shape):
            raise Invalid(f"{name}: bad shape {shape!r}")
        if not (_is_array(offsets) and len(offsets) == 2 and all(_is_count(o) for o in offsets)):
            raise Invalid(f"{name}: bad data_offsets {offsets!r}")
        infos.append((tuple(offsets), name, dtype, tuple(shape)))
    body = data[8 + n:]
    end = 0
    out = {}
    for (begin, stop), name, dtype, shape in sorted(infos):
        if begin != end or stop < begin:
            raise Invalid(f"{name}: offsets {begin}..{stop} do not follow the previous tensor's end {end}")
        if math.prod(shape) * DTYPE_BYTES[dtype] != stop - begin:
            raise Invalid(f"{name}: {stop - begin} bytes for {dtype} {shape}")
        out[name] = (dtype, shape, body[begin:stop])
        end = stop
    if end != len(body):
        raise Invalid(f"the tensors end at {end}, the data section at {len(body)}")
    return out


def expected_tensors(data: bytes, exported: dict) -> tuple[dict | None, bool | None]:
    """(tensors a correct load returns, verdict) for weights `data` of a checkpoint exported with tensors
    `exported` (parse_safetensors of the export): verdict True (must load: every exported tensor there with its
    dtype and shape, and nothing else), None (may load or refuse: all of those and extra tensors), False (must
    refuse: not safetensors, or an exported tensor missing or of another dtype or shape); tensors None then."""
    try:
        got = parse_safetensors(data)
    except Invalid:
        return None, False
    if any(name not in got or got[name][:2] != exported[name][:2] for name in exported):
        return None, False
    return got, (True if got.keys() == exported.keys() else None)


def tensors_differ(loaded: dict, want: dict) -> str | None:
    """How the loaded tensors {name: torch.Tensor} differ from `want` {name: (dtype, shape, bytes)}: names,
    dtypes, shapes and every byte; None where they agree."""
    if loaded.keys() != want.keys():
        return f"names differ: {sorted(set(loaded) ^ set(want))[:4]}"
    for name, (dtype, shape, raw) in want.items():
        t = loaded[name]
        if TORCH_DTYPES.get(dtype) != t.dtype or tuple(t.shape) != shape:
            return f"{name} loaded as {t.dtype} {tuple(t.shape)}, the file says {dtype} {shape}"
        if t.contiguous().view(torch.uint8).numpy().tobytes() != raw:
            return f"{name} loaded other bytes than the file holds"
    return None


def checkpoint_differs(ck, manifest: dict, want: dict) -> str | None:
    """How a loaded checkpoint differs from what its manifest (the dict written) and weights (`want`, from
    expected_tensors) say: the manifest as written, every config field it gives, every linear's shape, group size
    and offset flag, and the tensors byte for byte; None where it agrees."""
    same = lambda a, b: json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)   # 1, 1.0, true differ
    if not same(ck.manifest, manifest):
        return "the loaded manifest is not the one written"
    for key, value in manifest["config"].items():
        have = getattr(ck.config, key, None)
        if hasattr(ck.config, key) and not same(list(have) if isinstance(have, tuple) else have, value):
            return f"config {key} loaded as {have!r}, the manifest says {value!r}"
    for name, spec in ck.linears.items():
        entry = manifest["linears"][name]
        if not same([list(spec.shape), spec.group_size, spec.offset],
                    [entry["shape"], entry["group_size"], entry.get("offset", False)]):
            return f"linear {name} loaded as {spec}, the manifest says {entry}"
    return tensors_differ(ck.tensors, want)
