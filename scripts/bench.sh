#!/usr/bin/env bash
# Runs every benchmark binary and prints the machine it ran on (figures go to docs/benchmarks.md).
set -euo pipefail
build="${1:-build}"
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(date -u +%F)"
for b in "$build"/bench/*_bench; do
  echo "== $(basename "$b")"
  "$b" --benchmark_min_time=0.5
done
echo "== whole-process start-up (scripts/startup.sh)"
bash "$(dirname "$0")/startup.sh" "$build"
