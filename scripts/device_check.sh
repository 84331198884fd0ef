#!/usr/bin/env bash
# The one prepared script for a CUDA machine (<= 300 s by default, no network): every kernel against the oracle on the GPU,
# kernel GB/s against copy bandwidth, the triton backend lossless on the 135M shape, pass times with and without
# CUDA graphs (135M shapes, Llama-2-7B with --with-7b; random planes built on the GPU: the checkpoint cannot travel), and the
# speed-up they project at the real model's measured acceptance, each pass's device time by kernel family (profile),
# and where TensorRT is importable the SmolLM2 engine
# (--checkpoint DIR, or an RTN export of the default model made here) against the independent step reference, with
# its ping-pong KV binding, the plane copies its engine inspector lists and its plugins' kv_window. Writes
# $OUT/device_check.json and, generated from it, $OUT/device_check.md (the docs table). TensorRT is reported and
# skipped where it is not installed.
# The JSON is rewritten before and after every section (`running`, `complete`), each section has its own time limit
# (--limits), and the whole run stops after DEVICE_CHECK_TIMEOUT seconds (300, 600 where TensorRT is importable: its
# section may take 300; the gptq section's 300 more with --with-gptq): a timeout anywhere leaves the sections done.
# The plugins section runs the TensorRT plugins' suites on the device through the stand-in. The 7B shape is opt-in
# (--with-7b; skipped by itself on a device with under 12 GiB, an 8 GB Orin). The gptq section is opt-in (--with-gptq,
# its limit added to the run's timeout): the default model exported with GPTQ on CUDA (`scripts/export.py --device
# cuda`) and evaluated as the committed CPU figures were, passed where its draft/target agreement is within 0.5 points
# of them on every corpus.
#
# With --with-sweep, the decode GEMV's launch sweep (scripts/gemv_sweep.py: access-pattern probes, tiled and canonical
# planes, warps x row tiles x split-K at the shapes beyond L2) runs after the check, bounded by GEMV_SWEEP_TIMEOUT
# (240 s), writing $OUT/gemv_sweep.json: what to change where the check's GEMV rows fall short of the copy bandwidth.
#
#   OUT=/some/dir bash scripts/device_check.sh [--with-7b] [--with-gptq] [--with-sweep] [--repeats N] [--sections a,b]
#                                              [--limits kernels=200]
#   DRY=1 OUT=/tmp/x bash scripts/device_check.sh --repeats 1   # the same code here, Triton interpreter, tiny shapes
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/bitnest-device-check}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
ARGS=()
if [ "${DRY:-0}" = "1" ]; then
  export TRITON_INTERPRET=1; ARGS+=(--dry)
else
  unset TRITON_INTERPRET                    # the compiler on the GPU, never the interpreter
fi
WHOLE=300
if [ "${DRY:-0}" = "1" ]; then WHOLE=540; fi  # the interpreter on a CPU: its sections' limits are 4x (DRY_LIMIT_SCALE)
if ! "$PY" -c "import tensorrt" >/dev/null 2>&1; then
  echo "device_check: TensorRT is not installed here: the engine build and the tensorrt backend are skipped" >&2
else
  WHOLE=600                                 # the tensorrt section's limit (300 s) on top
fi
SWEEP=0
CHECK_ARGS=()
for arg in "$@"; do
  if [ "$arg" = "--with-gptq" ]; then           # the opt-in gptq section's limit on top (export/tools/device_check.py)
    WHOLE=$((WHOLE + $("$PY" -c 'from export.tools.device_check import LIMITS; print(int(LIMITS["gptq"]))')))
  fi
  if [ "$arg" = "--with-sweep" ]; then SWEEP=1; else CHECK_ARGS+=("$arg"); fi
done
DEVICE_CHECK_TIMEOUT=${DEVICE_CHECK_TIMEOUT:-$WHOLE}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >&2 || true
status=0
timeout "$DEVICE_CHECK_TIMEOUT" "$PY" -m export.commands device-check --out "$OUT/device_check.json" "${ARGS[@]}" \
  "${CHECK_ARGS[@]}" || status=$?
if [ "$status" = 124 ]; then
  echo "device_check: stopped after $DEVICE_CHECK_TIMEOUT s; $OUT/device_check.json holds the sections done" >&2
fi
if [ -f "$OUT/device_check.json" ]; then
  "$PY" -m export.commands device-check --table "$OUT/device_check.json" | tee "$OUT/device_check.md"
fi
if [ "$SWEEP" = 1 ]; then
  SWEEP_ARGS=(--out "$OUT/gemv_sweep.json")
  if [ "${DRY:-0}" = "1" ]; then SWEEP_ARGS+=(--dry --shapes 1024x64 --repeats 1); fi
  sweep_status=0
  timeout "${GEMV_SWEEP_TIMEOUT:-240}" "$PY" scripts/gemv_sweep.py "${SWEEP_ARGS[@]}" || sweep_status=$?
  if [ "$sweep_status" != 0 ]; then
    echo "device_check: the GEMV sweep stopped (exit $sweep_status); $OUT/gemv_sweep.json holds the shapes done" >&2
  fi
fi
exit $status
