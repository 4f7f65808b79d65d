#!/usr/bin/env bash
# The GPU check, for a lent machine with one NVIDIA GPU (issue 17): at most ~8 minutes end to
# end, everything it prints streamed to $OUT/all.log as it happens, and three files back:
#
#   $OUT/all.log          every command and its output, in order
#   $OUT/summary.txt      the figures: toolkit and driver, tests, GEMM rates, MFU, losses, errors
#   $OUT/results.tar.gz   plans, measured.json files, the calibrated cluster, ptdp info
#
# Stages, in order of value, each with a time limit cut to what is left of the budget (a stage
# that would not fit is skipped and says so): the device's toolkit and driver; the binaries
# (carried from the dev machine, .gpu-carry/ by scripts/gpu-carry.sh, else built here);
# the GPU unit tests (every kernel against the CPU backend, the flash attention kernels among
# them); the GEMM and attention benchmark (both flash kernels against unfused); GPT-2 medium
# 1x1x1 at micro-batch 8 and 16 (MFU), and its device time op by op (PTDP_CUDA_PROFILE); tp 2
# and pp 2 on the one GPU (DeviceWorld) against the 1x1x1 losses; `calibrate --backend cuda
# --quick` and `compare` on the calibrated cluster; last, 1x1x1 with
# PTDP_CUDA_ATTENTION=flash-mma (the register-resident flash kernels) and =unfused, with
# PTDP_CUDA_EPILOGUE=off (bias and GeLU as separate kernels) and with --fp32-activations (the
# path before bf16 storage), speed and losses against the bf16 flash run.
#
#   device run, carry [".gpu-carry", ".gpu-deps"], command: bash scripts/gpu-check.sh
#   scripts/gpu-check.sh [OUT_DIR]     # default $OUT; GPU_CHECK_BUDGET_S (default 450) seconds
#
# A dry run without a GPU, of the script itself (its stages, the JSON it reads, the summary):
# GPU_CHECK_EMULATE=build runs it on the CUDA emulator (runtime/cuda/emu) with build/'s binaries
# and lib/ptdp/libptdp_cuda_emu.so, the emulated GPU tests, gpt-tiny for GPT-2 medium, no speed
# probe, no GEMM benchmark and no calibration (the emulator's speed means nothing), e.g.
#   GPU_CHECK_EMULATE=build GPU_CHECK_STEPS=4 GPU_CHECK_BUDGET_S=3000 scripts/gpu-check.sh /tmp/dry
#
# Nothing is unpacked into / (the device machine's notes warn against it): the build fallback
# unpacks .gpu-deps/*.deb (scripts/gpu-deps.sh) into .gpu-deps/root and points CMake there.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out="${1:-${OUT:-}}"
if [ -z "$out" ]; then
  echo "usage: scripts/gpu-check.sh OUT_DIR (or set OUT)" >&2
  exit 2
fi
mkdir -p "$out"
: > "$out/all.log"
exec 3>&1 4>&2
exec > >(tee -a "$out/all.log") 2>&1
tee_pid=$!
budget=${GPU_CHECK_BUDGET_S:-450}
t0=$(date +%s)
work=$(mktemp -d /tmp/gpu-check.XXXXXX)
summary="$out/summary.txt"
: > "$summary"
say() { echo "$*"; echo "$*" >> "$summary"; }
elapsed() { echo "$(( $(date +%s) - t0 ))s"; }
left() { echo $(( budget - ($(date +%s) - t0) )); }
finish() {
  say "[$(elapsed)] done; files: all.log, summary.txt, results.tar.gz"
  tar -czf "$out/results.tar.gz" -C "$work" . 2> /dev/null
  rm -rf "$work"
  exec 1>&3 2>&4
  wait "$tee_pid" 2> /dev/null
}
trap finish EXIT
# stage NAME LIMIT_S CMD...: CMD under a limit cut to the budget left (skipped below 20 s).
stage() {
  local name=$1 limit=$(( $2 * limit_scale )) l rc
  shift 2
  l=$(left)
  if (( l < 20 )); then
    say "[$(elapsed)] $name: skipped, ${l}s of the ${budget}s budget left"
    return 99
  fi
  (( limit > l - 10 )) && limit=$(( l - 10 ))
  echo "=== [$(elapsed)] $name (limit ${limit}s): $*"
  timeout -k 5 "$limit" "$@"
  rc=$?
  if (( rc == 124 || rc == 137 )); then
    say "[$(elapsed)] $name: timed out after ${limit}s"
  else
    say "[$(elapsed)] $name: exit $rc"
  fi
  return $rc
}
json() {  # json FILE PYTHON-EXPRESSION-OF-j: prints it, or "?"
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1" 2> /dev/null || echo "?"
}

# ---- 1. the device: GPU, driver, toolkit, the CUDA libraries the binaries load
say "== ptdp GPU check $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2> /dev/null || echo '?')"
emulate=${GPU_CHECK_EMULATE:-}
train_flags=()
limit_scale=1  # stage limits are a GPU's; the emulator's runs take several times longer
if [ -n "$emulate" ]; then
  export PTDP_CUDA_MODULE=$PWD/$emulate/lib/ptdp/libptdp_cuda_emu.so
  [ -f "$PTDP_CUDA_MODULE" ] || { say "no emulated CUDA module: $PTDP_CUDA_MODULE"; exit 1; }
  say "gpu: the CUDA emulator ($PTDP_CUDA_MODULE): a dry run of this script"
  bin=$emulate
  tests=("$emulate"/tests/runtime/cuda/*_emu_test)
  train_flags=(--no-speed-probe)
  limit_scale=8
elif ! nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader \
     > "$work/gpu.txt" 2>&1; then
  say "no usable GPU: $(cat "$work/gpu.txt")"
  exit 1
else
say "gpu: $(head -1 "$work/gpu.txt")"
say "toolkit: $(nvcc --version 2> /dev/null | tail -1 || echo 'no nvcc')"
libpath=()
[ -d .gpu-carry/lib ] && libpath+=("$PWD/.gpu-carry/lib")
# NCCL and cuBLAS: the system's, else the wheels beside PyTorch (nvidia-nccl-cu13, nvidia-cublas).
for pkg in nccl:libnccl.so.2 cublas:libcublas.so.13 cuda_runtime:libcudart.so.13; do
  mod=${pkg%%:*} lib=${pkg#*:}
  if ! ldconfig -p 2> /dev/null | grep -q "$lib" && ! [ -e "/usr/local/cuda/lib64/$lib" ]; then
    dir=$(python3 -c "import nvidia.$mod as m; print(m.__path__[0] + '/lib')" 2> /dev/null) || dir=""
    if [ -n "$dir" ] && [ -e "$dir/$lib" ]; then
      libpath+=("$dir")
      say "$lib: from $dir"
    else
      say "$lib: not found"
    fi
  fi
done
[ -d /usr/local/cuda/lib64 ] && libpath+=(/usr/local/cuda/lib64)
LD_LIBRARY_PATH="$(IFS=:; echo "${libpath[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
fi

# ---- 2. the binaries: carried, else built here
usable() {  # usable DIR: its ptdp loads the CUDA module and sees a GPU
  [ -x "$1/ptdp" ] || return 1
  "$1/ptdp" info --json > "$work/info.json" 2> "$work/info.err" || return 1
  [ "$(json "$work/info.json" "'cuda' in j['backends']")" = True ]
}
[ -n "$emulate" ] || { bin=""; tests=(); }
if [ -z "$bin" ] && [ -d .gpu-carry/build ]; then
  say "carried: $(head -2 .gpu-carry/MANIFEST 2> /dev/null | tr '\n' ' ')"
  built_from=$(awk 'NR == 1 {print $2}' .gpu-carry/MANIFEST 2> /dev/null)
  here=$(git rev-parse --short HEAD 2> /dev/null || echo '?')
  if [ "$built_from" != "$here" ]; then
    say "warning: the carried binaries were built from $built_from, this checkout is $here"
  fi
  if usable .gpu-carry/build; then
    bin=.gpu-carry/build
    tests=(.gpu-carry/build/tests/*)
  else
    why="$(json "$work/info.json" "j.get('why_no_gpu')") $(head -c 300 "$work/info.err")"
    say "the carried binaries do not run here: $why"
    ldd .gpu-carry/build/lib/ptdp/libptdp_cuda.so | grep "not found" | head -5
    # A binary that loads but finds no usable GPU would not do better built here.
    if ! grep -qE "GLIBC|not found|cannot open|undefined symbol|version .GLIBCXX|No such file" \
         <<< "$why"; then
      say "the CUDA module loaded, so the GPU or driver is the problem: stopping"
      exit 1
    fi
  fi
fi
if [ -z "$bin" ]; then
  if ! [ -f /usr/include/yaml-cpp/yaml.h ] && ls .gpu-deps/*.deb > /dev/null 2>&1; then
    mkdir -p .gpu-deps/root
    for f in .gpu-deps/*.deb; do dpkg -x "$f" .gpu-deps/root; done
    deps=$PWD/.gpu-deps/root
    export CMAKE_PREFIX_PATH="$deps/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
    export CPATH="$deps/usr/include${CPATH:+:$CPATH}"
    export LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$deps/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH"
    say "build dependencies: $(find .gpu-deps -maxdepth 1 -name '*.deb' | wc -l) packages unpacked into .gpu-deps/root"
  fi
  gen=""; command -v ninja > /dev/null && gen="-G Ninja"
  # shellcheck disable=SC2086  # gen is one or two words
  stage configure 60 cmake -S . -B build-gpu $gen -DCMAKE_BUILD_TYPE=Release -DPTDP_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90-real -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON || exit 1
  stage build 240 cmake --build build-gpu -j "$(nproc)" --target ptdp ptdp_cuda ptdp_share \
    cuda_check_test cuda_backend_test cuda_gpt_test device_world_test nccl_world_test \
    cuda_trainer_test calibrate_cuda_test gemm_bench comm_bench || exit 1
  usable build-gpu || { say "built, but: $(json "$work/info.json" "j.get('why_no_gpu')")"; exit 1; }
  bin=build-gpu
  tests=(build-gpu/tests/runtime/cuda/*_test build-gpu/tests/cli/calibrate_cuda_test)
fi
ptdp=$bin/ptdp
say "ptdp: $bin; $("$ptdp" info | grep -E '^(cuda|nccl)' | tr -s ' ' | tr '\n' ';')"

# ---- 3. the GPU unit tests: every kernel against the CPU backend, the model, communicators
for t in "${tests[@]}"; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  stage "test $name" 90 "$t" --gtest_brief=1 > "$work/$name.log" 2>&1
  cat "$work/$name.log"
  say "  $name: $(grep -E '^\[  (PASSED  |FAILED  |SKIPPED )\] [0-9]+ test' "$work/$name.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \] [A-Za-z]' "$work/$name.log" | head -8 | sed 's/^/    /' >> "$summary"
done

# ---- 4. GEMM (cuBLAS, the shapes the model runs) and communicators
if [ -n "$emulate" ]; then
  say "gemm-bench: skipped (emulated)"
  : > "$work/gemm.log"
elif stage gemm-bench 45 "$bin/bench/gemm_bench" --benchmark_min_time=0.1 > "$work/gemm.log" 2>&1; then :; fi
cat "$work/gemm.log"
grep -E "^gemm.*TFLOP|peak" "$work/gemm.log" | head -32 | sed 's/^/  /' >> "$summary"
grep -E "^attention/" "$work/gemm.log" | sed 's/^/  /' >> "$summary"
# Which flash kernels to make the default: each shape and pass, flash-mma's time over flash's.
python3 - "$work/gemm.log" <<'PY' 2>&1 | sed 's/^/  /' | tee -a "$summary"
import re, sys
t = {}
for line in open(sys.argv[1]):
    m = re.match(r'attention/(\S+?)/(flash|flash-mma|unfused)/(forward|backward)\S*\s+([0-9.]+) (ns|us|ms|s)\b', line)
    if m:
        t[(m[1], m[3], m[2])] = float(m[4]) * {'ns': 1e-9, 'us': 1e-6, 'ms': 1e-3, 's': 1.0}[m[5]]
for (shape, pas, k), v in sorted(t.items()):
    if k == 'flash' and (shape, pas, 'flash-mma') in t:
        print('attention %s %s: flash-mma takes %.2f of flash\'s time' % (shape, pas, t[(shape, pas, 'flash-mma')] / v))
PY

# ---- 5. GPT-2 medium on the GPU: 1x1x1 at micro-batch 8 and 16 (MFU), tp 2 and pp 2 on one GPU
model=${GPU_CHECK_MODEL:-configs/models/gpt2-medium.yaml}
[ -n "$emulate" ] && model=${GPU_CHECK_MODEL:-configs/models/gpt-tiny.yaml}
cluster=configs/clusters/dgx-h200.yaml
steps=${GPU_CHECK_STEPS:-20}
train() {  # train NAME GPUS "PLAN FLAGS" [TRAIN FLAGS...]
  local name=$1 gpus=$2 flags=$3
  shift 3
  # shellcheck disable=SC2086  # flags are words
  stage "plan $name" 30 "$ptdp" plan --cluster "$cluster" --model "$model" --gpus "$gpus" \
    --global-batch 16 --recompute none $flags --top 1 --out "$work/$name.plan.yaml" \
    > "$work/plan-$name.log" 2>&1 || { cat "$work/plan-$name.log"; return 1; }
  stage "train $name" 75 "$ptdp" train "$work/$name.plan.yaml" --backend cuda --steps "$steps" \
    --timing-warmup 3 --out "$work/$name.measured.json" "${train_flags[@]}" "$@"
  local m=$work/$name.measured.json
  [ -f "$m" ] || return 1
  say "  $name: step $(json "$m" "'%.1f ms' % (1e3 * j['summary']['median_step_time_s'])"), $(json "$m" "'%.0f tokens/s' % j['summary']['tokens_per_s']"), MFU $(json "$m" "'%.1f%%' % (100 * j['summary']['mfu'])"), peak $(json "$m" "'%.1f GiB' % (max(r['peak_memory_bytes'] for r in j['timing']['ranks']) / 2**30)"), loss $(json "$m" "'%.4f -> %.4f' % (j['steps'][0]['loss'], j['steps'][-1]['loss'])")"
}
train 1x1x1-mb8 1 "--tp 1 --pp 1 --micro-batch 8"
train 1x1x1-mb16 1 "--tp 1 --pp 1 --micro-batch 16"
# Where the 1x1x1 step's device time goes, op by op and shape by shape (PTDP_CUDA_PROFILE: events
# around each op, so not a timed run), the largest first, into the summary.
if [ -f "$work/1x1x1-mb8.plan.yaml" ]; then
  PTDP_CUDA_PROFILE=1 stage "profile 1x1x1-mb8" 60 "$ptdp" train "$work/1x1x1-mb8.plan.yaml" \
    --backend cuda --steps 5 --timing-warmup 1 --out "$work/profile.measured.json" \
    "${train_flags[@]}" > "$work/profile.log" 2>&1
  cat "$work/profile.log"
  sed -n '/^CUDA op profile/,/ all$/p' "$work/profile.log" | head -44 | sed 's/^/  /' >> "$summary"
fi
train tp2 2 "--tp 2 --pp 1 --micro-batch 8" --one-gpu
train pp2 2 "--tp 1 --pp 2 --micro-batch 8" --one-gpu
ref=$work/1x1x1-mb8.measured.json
against_1x1x1() {  # against_1x1x1 NAME...: the largest loss difference of each run to 1x1x1-mb8
  local name m
  for name in "$@"; do
    m=$work/$name.measured.json
    if ! [ -f "$ref" ] || ! [ -f "$m" ]; then continue; fi
    say "  $name against 1x1x1 (the same 16 sequences a step): largest loss difference $(python3 -c "
import json, sys
a = [s['loss'] for s in json.load(open(sys.argv[1]))['steps']]
b = [s['loss'] for s in json.load(open(sys.argv[2]))['steps']]
print('%.2e over %d steps' % (max(abs(x - y) for x, y in zip(a, b)), min(len(a), len(b))))" "$ref" "$m" 2>&1)"
  done
}
against_1x1x1 tp2 pp2

# ---- 6. calibrate this GPU, then compare the runs above with the calibrated cluster's model
cal=$work/calibrated.yaml
if [ -n "$emulate" ]; then
  say "calibrate: skipped (emulated)"
elif stage calibrate 120 "$ptdp" calibrate --backend cuda --quick --out "$cal"; then
  for name in 1x1x1-mb8 1x1x1-mb16 tp2 pp2; do
    [ -f "$work/$name.measured.json" ] || continue
    "$ptdp" compare "$work/$name.plan.yaml" "$work/$name.measured.json" --cluster "$cal" \
      > "$work/compare-$name.log" 2>&1
    cat "$work/compare-$name.log"
    grep -E "^summary|^  (compute|tp_comm|pp_bubble|optimizer) " "$work/compare-$name.log" \
      | sed "s/^/  calibrated $name: /" >> "$summary"
  done
fi

# ---- 7. the register-resident flash kernels (flash-mma, written without a GPU) and the unfused
# attention core (P kept, cuBLAS) against the default WMMA flash kernels: speed, losses
PTDP_CUDA_ATTENTION=flash-mma train 1x1x1-mb8-flash-mma 1 "--tp 1 --pp 1 --micro-batch 8"
against_1x1x1 1x1x1-mb8-flash-mma
PTDP_CUDA_ATTENTION=unfused train 1x1x1-mb8-unfused 1 "--tp 1 --pp 1 --micro-batch 8"
against_1x1x1 1x1x1-mb8-unfused

# ---- 8. bias and GeLU as separate kernels instead of cuBLASLt's epilogues: speed, losses
PTDP_CUDA_EPILOGUE=off train 1x1x1-mb8-noepilogue 1 "--tp 1 --pp 1 --micro-batch 8"
against_1x1x1 1x1x1-mb8-noepilogue

# ---- 9. fp32 activations and weights (bf16 GEMMs only: the path before bf16 storage)
train 1x1x1-mb8-fp32act 1 "--tp 1 --pp 1 --micro-batch 8" --fp32-activations
against_1x1x1 1x1x1-mb8-fp32act
