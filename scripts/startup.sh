#!/usr/bin/env bash
# Whole-process cost of the ptdp binary (issue 11): wall time and peak RSS of `ptdp plan` (GPT-3
# 175B on 1024 A100s), `ptdp simulate` of the Megatron paper's 1T row and `ptdp info`, each run
# RUNS times; prints the median wall time and the median peak RSS (`/usr/bin/time -f %M`, five
# runs) with the machine's load. Needs bash 5 ($EPOCHREALTIME) and /usr/bin/time. Targets and
# figures: docs/benchmarks.md, "Whole-process start-up".
#
#   scripts/startup.sh [BUILD] [RUNS]       # BUILD default build, RUNS default 20
set -euo pipefail
build="${1:-build}"
runs="${2:-20}"
build=$(cd "$build" && pwd)  # before the cd below
cd "$(dirname "$0")/.."
ptdp="$build/ptdp"
[ -x /usr/bin/time ] || { echo "startup.sh: needs /usr/bin/time (apt install time)"; exit 1; }

a100=configs/clusters/dgx-a100.yaml
declare -A cmds=(
  [plan]="plan --cluster $a100 --model configs/models/gpt3-175b.yaml --global-batch 1536"
  [simulate-1t]="simulate --cluster $a100 --model configs/models/megatron-1t.yaml --nodes 384 \
--global-batch 3072 --tp 8 --pp 64 --dp 6 --vp 2 --micro-batch 1 --recompute full"
  [info]="info"
)

median() { sort -n | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(date -u +%F)"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
rss_file=$(mktemp)
trap 'rm -f "$rss_file"' EXIT
for name in plan simulate-1t info; do
  read -r -a args <<< "${cmds[$name]}"
  "$ptdp" "${args[@]}" > /dev/null  # warm the page cache
  # Wall time from bash's own clock ($EPOCHREALTIME, no process of its own), so that only ptdp's
  # fork, exec and run are in it; peak RSS in runs of their own under /usr/bin/time.
  walls=() rss=()
  for ((i = 0; i < runs; i++)); do
    t0=$EPOCHREALTIME
    "$ptdp" "${args[@]}" > /dev/null
    t1=$EPOCHREALTIME
    walls+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.3f", (b - a) * 1e3}')")
  done
  for ((i = 0; i < 5; i++)); do
    /usr/bin/time -f %M -o "$rss_file" "$ptdp" "${args[@]}" > /dev/null
    rss+=("$(cat "$rss_file")")
  done
  wall_ms=$(printf '%s\n' "${walls[@]}" | median | awk '{printf "%.1f", $1}')
  rss_mib=$(printf '%s\n' "${rss[@]}" | median | awk '{printf "%.1f", $1 / 1024}')
  printf '%-12s median %7s ms  peak RSS %7s MiB  (%d runs; RSS: median of 5)\n' "$name" \
    "$wall_ms" "$rss_mib" "$runs"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
