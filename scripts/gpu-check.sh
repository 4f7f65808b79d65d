#!/usr/bin/env bash
# The GPU check: one script for a machine with an NVIDIA GPU (issues 5 and 6). It builds ptdp with
# the CUDA backend, runs the GPU tests and the GEMM/collective benchmarks, trains three layouts of
# GPT-2 medium (350M) for a few dozen steps, compares each with its prediction, calibrates the GPU
# (`ptdp calibrate --backend cuda --quick`) and compares the same layouts with the calibrated
# cluster's predictions, and leaves everything under OUT_DIR: summary.txt (the figures) and
# gpu-check.tar.gz (every log, measured.json and the calibrated cluster). It aims to finish
# within 8 minutes on one H200.
#
#   scripts/gpu-check.sh OUT_DIR [STEPS]          # STEPS per layout, default 30
#
# Machines that reach no package registry: run scripts/gpu-deps.sh where one is reachable and
# bring .gpu-deps/ along; its Debian packages are unpacked here for whatever is missing.
set -uo pipefail
out="${1:?usage: scripts/gpu-check.sh OUT_DIR [STEPS]}"
steps="${2:-30}"
cd "$(dirname "$0")/.."
mkdir -p "$out/logs"
logs="$out/logs"
summary="$out/summary.txt"
t0=$(date +%s)
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
elapsed() { echo "$(( $(date +%s) - t0 )) s"; }
# stage NAME TIMEOUT_S CMD...: runs CMD with a time limit, its output in logs/NAME.log.
stage() {
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  say "[$(elapsed)] $name: exit $rc"
  return $rc
}

say "== ptdp GPU check, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader \
  2>&1 | tee -a "$summary" || { say "nvidia-smi failed: no GPU here"; exit 1; }
nvcc --version | tail -2 >> "$summary" 2>&1

# Build dependencies the image lacks, from .gpu-deps/*.deb (scripts/gpu-deps.sh).
if ! [ -f /usr/include/yaml-cpp/yaml.h ] && ls .gpu-deps/*.deb > /dev/null 2>&1; then
  for f in .gpu-deps/*.deb; do dpkg -x "$f" /; done
  ldconfig 2>/dev/null || true
  say "unpacked $(ls .gpu-deps/*.deb | wc -l) packages from .gpu-deps/"
fi
# NCCL: the toolkit's, else the one pip ships (nvidia-nccl-cu13) with PyTorch.
if ! ls /usr/local/cuda/include/nccl.h > /dev/null 2>&1 && [ -z "${NCCL_HOME:-}" ]; then
  NCCL_HOME=$(python3 -c 'import nvidia.nccl as n, os; print(os.path.dirname(n.__file__))' 2>/dev/null) || true
  if [ -n "$NCCL_HOME" ]; then
    export NCCL_HOME
    [ -e "$NCCL_HOME/lib/libnccl.so" ] || ln -sf "$NCCL_HOME/lib/libnccl.so.2" "$NCCL_HOME/lib/libnccl.so"
    export LD_LIBRARY_PATH="$NCCL_HOME/lib:${LD_LIBRARY_PATH:-}"
    say "NCCL from $NCCL_HOME"
  fi
fi

arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
gen=""; command -v ninja > /dev/null && gen="-G Ninja"
stage configure 120 cmake -S . -B build-gpu $gen -DCMAKE_BUILD_TYPE=Release -DPTDP_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DPTDP_NATIVE=ON || { tar -czf "$out/gpu-check.tar.gz" -C "$out" logs; exit 1; }
stage build 300 cmake --build build-gpu -j "$(nproc)" || { tar -czf "$out/gpu-check.tar.gz" -C "$out" logs; exit 1; }
ptdp=build-gpu/ptdp
"$ptdp" info | tee -a "$summary"

# GPU tests (kernels against the CPU backend, the model, communicators, layouts), then the rest.
stage gpu-tests 300 ctest --test-dir build-gpu -R 'cuda|Cuda|Device|Nccl' --output-on-failure -j 4
grep -E "tests passed|tests failed|Skipped|\*\*\*Failed" "$logs/gpu-tests.log" | tail -5 >> "$summary"
stage gemm-bench 90 build-gpu/bench/gemm_bench --benchmark_min_time=0.2
grep -E "TFLOP|peak" "$logs/gemm-bench.log" | head -20 >> "$summary"
if [ -x build-gpu/bench/comm_bench ]; then
  stage comm-bench 90 build-gpu/bench/comm_bench --benchmark_min_time=0.1
  grep -E "busbw" "$logs/comm-bench.log" | tail -12 >> "$summary"
fi

# Three layouts of GPT-2 medium on this machine's GPUs: 1x1x1 (the MFU target), tp 2 and pp 2.
# With one GPU the 2-rank layouts run as 2 ranks on it (the device communicator).
model=configs/models/gpt2-medium.yaml
cluster=configs/clusters/dgx-h200.yaml
layouts=("1x1x1:1:--tp 1 --pp 1 --micro-batch 8" "tp2:2:--tp 2 --pp 1 --micro-batch 8"
         "pp2:2:--tp 1 --pp 2 --micro-batch 4")
for spec in "${layouts[@]}"; do
  name=${spec%%:*}; rest=${spec#*:}; gpus=${rest%%:*}; flags=${rest#*:}
  # shellcheck disable=SC2086
  stage "plan-$name" 30 "$ptdp" plan --cluster "$cluster" --model "$model" --gpus "$gpus" \
    --global-batch 16 $flags --top 1 --out "$logs/$name.plan.yaml" || continue
  stage "train-$name" 150 "$ptdp" train "$logs/$name.plan.yaml" --backend cuda --steps "$steps" \
    --out "$logs/$name.measured.json"
  grep -E "^step +$steps/|validation|MFU|TFLOP" "$logs/train-$name.log" | sed "s/^/  $name: /" >> "$summary"
  if "$ptdp" compare --help > /dev/null 2>&1; then
    stage "compare-$name" 30 "$ptdp" compare "$logs/$name.plan.yaml" "$logs/$name.measured.json"
    tail -3 "$logs/compare-$name.log" | sed "s/^/  $name: /" >> "$summary"
  fi
done

# Calibration (issue 6): this GPU's primitives measured through the runtime (every op on GPU 0,
# bf16 GEMMs; collectives placed as `ptdp train` places the ranks here: DeviceWorld with one GPU,
# NCCL with more), then the same layouts planned on the calibrated cluster and compared with
# their runs above. A calibrated plan of the same layout is compared with the run above (the
# same thing measured: no second training); one whose layout differs is trained first.
cal="$logs/calibrated.yaml"
if stage calibrate 180 "$ptdp" calibrate --backend cuda --quick --out "$cal"; then
  grep -E "^measured in|\^3|best|bandwidth|ranks  all-reduce" "$logs/calibrate.log" \
    | sed "s/^/  calibrate: /" >> "$summary"
  for spec in "${layouts[@]}"; do
    name=${spec%%:*}; rest=${spec#*:}; gpus=${rest%%:*}; flags=${rest#*:}
    plan="$logs/cal-$name.plan.yaml"
    # shellcheck disable=SC2086
    stage "cal-plan-$name" 30 "$ptdp" plan --cluster "$cal" --model "$model" --gpus "$gpus" \
      --global-batch 16 $flags --top 1 --out "$plan" || continue
    measured="$logs/$name.measured.json"
    if ! stage "cal-compare-$name" 30 "$ptdp" compare "$plan" "$measured" &&
       { ! [ -f "$measured" ] || grep -q "is not the plan's" "$logs/cal-compare-$name.log"; }; then
      say "  calibrated $name: not the layout trained above (or no run of it): training it"
      measured="$logs/cal-$name.measured.json"
      stage "cal-train-$name" 150 "$ptdp" train "$plan" --backend cuda --steps "$steps" \
        --out "$measured" || continue
      stage "cal-compare-$name" 30 "$ptdp" compare "$plan" "$measured"
    fi
    grep -E "^ptdp compare|^step time|^peak memory" "$logs/cal-compare-$name.log" \
      | sed "s/^/  calibrated $name: /" >> "$summary"
  done
fi

say "[$(elapsed)] done"
tar -czf "$out/gpu-check.tar.gz" -C "$out" logs && rm -rf "$logs"
