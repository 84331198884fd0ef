"""The export's memory at a model's real shapes: a synthetic HF folder of a preset's shapes (random float16 weights,
any number of blocks, written shard by shard), exported in a fresh process per block count, its planned and measured
peak resident memory and seconds per block beside the plan for the whole model."""

import json
import math
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import torch

from edge.analysis.bench.machine import machine
from edge.errors import BitNestError
from edge.model.arch import ModelConfig
from edge.model.manifest import INDEX
from export.export_plan import plan_export
from export.shard_writer import ShardWriter

ROOT = Path(__file__).resolve().parents[2]


def hf_config(cfg: ModelConfig) -> dict:
    """The config.json an HF folder of `cfg` carries (what edge.model.arch.config_from_hf reads back)."""
    return {"architectures": [cfg.architecture], "model_type": cfg.family, "hidden_size": cfg.hidden_size,
            "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
            "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
            "vocab_size": cfg.vocab_size, "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
            "tie_word_embeddings": cfg.tie_word_embeddings, "attention_bias": cfg.attention_bias,
            "max_position_embeddings": cfg.max_position_embeddings, "torch_dtype": "float16"}


def _tensor_shapes(cfg: ModelConfig) -> dict[str, dict[str, tuple[int, ...]]]:
    """HF tensor shapes of `cfg`, grouped by the shard they are written to (`embed`, one per block, `head`)."""
    h = cfg.hidden_size
    groups = {"embed": {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}}
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        block = {p + s + ".weight": nk for s, nk in cfg.linear_shapes().items()}
        block.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
        if cfg.attention_bias:
            for s in ("q_proj", "k_proj", "v_proj"):
                block[p + f"self_attn.{s}.bias"] = (cfg.linear_shapes()[f"self_attn.{s}"][0],)
        groups[f"layer-{i:03d}"] = block
    if not cfg.tie_word_embeddings:
        groups["head"] = {"lm_head.weight": (cfg.vocab_size, h)}
    return groups


def write_synthetic_folder(cfg: ModelConfig, folder: Path, tokenizer_files: list[Path], seed: int = 0,
                           rows: int = 8192) -> Path:
    """An HF folder of `cfg`'s shapes with random float16 weights (N(0, 0.02), norms ones), written shard by shard
    and a block of rows at a time (never the whole model in memory), with an index and `tokenizer_files`."""
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    weight_map = {}
    for group, shapes in _tensor_shapes(cfg).items():
        name = f"{group}.safetensors"
        with ShardWriter(folder / name, {n: (torch.float16, s) for n, s in shapes.items()}) as w:
            for tensor, shape in shapes.items():
                if len(shape) == 1:
                    w.write(tensor, torch.ones(shape, dtype=torch.float16) if "norm" in tensor else
                            (torch.randn(shape, generator=gen) * 0.02).half())
                    continue
                for a in range(0, shape[0], rows):
                    n = min(rows, shape[0] - a)
                    w.write(tensor, (torch.randn(n, shape[1], generator=gen) * 0.02).half())
            w.close()
        weight_map.update({t: name for t in shapes})
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(hf_config(cfg)))
    for f in tokenizer_files:
        shutil.copyfile(f, folder / f.name)
    return folder


def measure(cfg: ModelConfig, layers: list[int], work: Path, calib_samples: int, calib_seq_len: int,
            method: str = "bitnest", keep: bool = False) -> dict:
    """Export `cfg` cut to each block count of `layers` in its own process; the summaries' memory and time (`keep`:
    the exports stay in `work`; the synthetic sources never do)."""
    from export.stream_source import open_source
    host = machine(torch.get_num_threads())                 # the load average before the exports
    with open_source("default") as default:                 # SmolLM2's tokenizer: calibration ids < every vocab here
        tokenizer = default.tokenizer_files()
    runs = {}
    for n in layers:
        small = replace(cfg, num_layers=n)
        folder = write_synthetic_folder(small, work / f"source-{n}", tokenizer)
        out = work / f"export-{n}"
        cmd = [sys.executable, "-m", "export.commands", "export", "--model", str(folder), "--out", str(out),
               "--method", method, "--calib-samples", str(calib_samples), "--calib-seq-len", str(calib_seq_len),
               "--json"]
        r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
        if r.returncode != 0:
            tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
            raise BitNestError(f"the export of {n} block(s) failed: {tail[:300]}")
        s = json.loads(r.stdout.strip().splitlines()[-1])
        runs[str(n)] = {"planned_peak": s["memory"]["planned_peak"], "measured_peak": s["memory"]["measured_peak"],
                        "plan": s["memory"]["plan"], "seconds_per_layer": s["seconds_per_layer"],
                        "seconds": s["seconds"], "checkpoint_bytes": s["bytes"]}
        shutil.rmtree(folder)
        if not keep:
            shutil.rmtree(out)
    peaks = [r["measured_peak"] for r in runs.values()]
    views = 1
    whole = {"run_settings": plan_export(cfg, calib_samples, calib_seq_len, views, method == "bitnest", True).to_dict(),
             "default_settings": plan_export(cfg, 64, 512, views, method == "bitnest", True).to_dict()}
    return {"shape": {"hidden": cfg.hidden_size, "intermediate": cfg.intermediate_size, "layers": cfg.num_layers,
                      "heads": cfg.num_heads, "kv_heads": cfg.num_kv_heads, "vocab": cfg.vocab_size,
                      "params": sum(math.prod(s) for g in _tensor_shapes(cfg).values() for s in g.values())},
            "method": method, "calibration": {"samples": calib_samples, "seq_len": calib_seq_len},
            "threads": torch.get_num_threads(), "machine": host, "runs": runs,
            "peak_spread": (max(peaks) - min(peaks)) / min(peaks), "plan_whole_model": whole}
