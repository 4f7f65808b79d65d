#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/: clang, AddressSanitizer + UndefinedBehaviorSanitizer)
# and runs each for <seconds>, one after the other on one core, starting from the seeds
# (configs/, tests/data/hf, fuzz/seeds) plus what earlier runs found (build-fuzz/corpus).
# Prints executions, coverage (cov: edges, ft: features) and findings per target, and exits 1
# if any target found a crash, a sanitizer report, a leak or an input running over 20 s.
#
# Usage: scripts/fuzz.sh <seconds> [target]
#   targets: cluster model plan hf_config layout_flags checkpoint (default: all, in that order)
#   env: PTDP_FUZZ_BUILD build folder (default build-fuzz), JOBS build parallelism (nproc)
# A finding is saved as build-fuzz/artifacts/<target>/crash-* (or timeout-*, leak-*); replay it
# with build-fuzz/fuzz/<target>_fuzz <file>.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:?usage: scripts/fuzz.sh <seconds> [target]}
only=${2:-}
build=${PTDP_FUZZ_BUILD:-build-fuzz}
all=(cluster model plan hf_config layout_flags checkpoint)
targets=()
for t in "${all[@]}"; do
  if [[ -z $only || $only == "$t" || $only == "${t}_fuzz" ]]; then targets+=("$t"); fi
done
if [[ ${#targets[@]} -eq 0 ]]; then echo "fuzz: unknown target '$only' (${all[*]})"; exit 2; fi

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DPTDP_FUZZ=ON -DPTDP_BUILD_TESTS=OFF -DPTDP_BUILD_BENCH=OFF \
  -DPTDP_CUDA=OFF > "$build.configure.log" 2>&1 || { cat "$build.configure.log"; exit 1; }
names=()
for t in "${targets[@]}"; do names+=("${t}_fuzz"); done
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target "${names[@]}"

seeds() {
  case $1 in
    cluster) echo configs/clusters ;;
    model) echo configs/models ;;
    plan) echo fuzz/seeds/plan ;;
    hf_config) echo tests/data/hf ;;
    layout_flags) echo fuzz/seeds/layout_flags ;;
    checkpoint) echo fuzz/seeds/checkpoint ;;
  esac
}

failed=0
summary="$build/fuzz-summary.txt"
printf '%-14s %8s %12s %10s %7s %7s %7s %9s\n' target seconds executions exec/s cov ft corpus findings | tee "$summary"
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t" art="$build/artifacts/$t" log="$build/fuzz-$t.log"
  mkdir -p "$corpus" "$art"
  rc=0
  "$build/fuzz/${t}_fuzz" "$corpus" "$(seeds "$t")" -max_total_time="$secs" -timeout=20 \
    -rss_limit_mb=4096 -dict="fuzz/dicts/${t}_fuzz.dict" -artifact_prefix="$art/" \
    -print_final_stats=1 > "$log" 2>&1 || rc=$?
  execs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log" | tail -1)
  rate=$(awk '/stat::average_exec_per_sec/ {print $2}' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<< "$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$last")
  corp=$(sed -n 's/.*corp: \([0-9]*\).*/\1/p' <<< "$last")
  findings=$(find "$art" -type f | wc -l)
  printf '%-14s %8s %12s %10s %7s %7s %7s %9s\n' "$t" "$secs" "${execs:-?}" "${rate:-?}" \
    "${cov:-?}" "${ft:-?}" "${corp:-?}" "$findings" | tee -a "$summary"
  if [[ $rc -ne 0 || $findings -ne 0 ]]; then
    failed=1
    echo "fuzz: $t failed (exit $rc); the end of $log:"
    tail -40 "$log"
  fi
done
exit $failed
