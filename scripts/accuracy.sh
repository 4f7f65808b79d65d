#!/usr/bin/env bash
# How well the calibrated cost model predicts this machine: calibrate it, then train each CPU
# layout that fits 2 cores (1x1x1, tp 2, pp 2, dp 2) RUNS times and compare every run with its
# prediction. Prints each run's step-time and memory errors and whether the machine was busy
# (other processes above 10% of the cores during the timed steps), then per layout the median
# error over the quiet runs: the figures of docs/cost-model.md, "Measured primitives".
#
#   scripts/accuracy.sh [build] [runs] [--quick]     e.g. scripts/accuracy.sh build 5
set -euo pipefail
build="${1:-build}"
runs="${2:-5}"
quick="${3:-}"
ptdp="$build/ptdp"
out="${ACCURACY_OUT:-$build/accuracy}"
mkdir -p "$out"

# A number from `ptdp compare --json` (nlohmann's dump(2): one "key": value per line).
field() { grep -m1 "\"$1\":" "$2" | sed -E 's/.*: ([^,]*),?$/\1/'; }

"$ptdp" calibrate --backend cpu $quick --out "$out/calibrated.yaml" 2> /dev/null | tail -n 1
printf '%-6s %4s %12s %12s %10s %10s %s\n' layout run predicted measured "step err" "mem err" machine
summary=""
for layout in "1x1x1:--gpus 1" "tp2:--gpus 2 --tp 2" "pp2:--gpus 2 --pp 2" "dp2:--gpus 2 --dp 2"; do
  name="${layout%%:*}"
  plan="$out/$name.plan.yaml"
  # shellcheck disable=SC2086  # the flags are words
  "$ptdp" plan --cluster "$out/calibrated.yaml" --model configs/models/gpt-tiny.yaml \
    --global-batch 8 ${layout#*:} --recompute none --top 1 --out "$plan" > /dev/null
  errors=""
  for run in $(seq 1 "$runs"); do
    "$ptdp" train "$plan" --steps 12 --timing-warmup 2 --out "$out/$name.$run.json" > /dev/null
    "$ptdp" compare "$plan" "$out/$name.$run.json" --json > "$out/$name.$run.compare.json"
    c="$out/$name.$run.compare.json"
    busy=$(field machine_busy "$c")
    share=$(field other_cpu_share "$c")
    err=$(field step_time_error_pct "$c")
    printf '%-6s %4s %9.2f ms %9.2f ms %+9.1f%% %+9.1f%% %s\n' "$name" "$run" \
      "$(awk "BEGIN{print 1000*$(field predicted_step_time_s "$c")}")" \
      "$(awk "BEGIN{print 1000*$(field measured_step_time_s "$c")}")" "$err" \
      "$(field memory_error_pct "$c")" \
      "$( [ "$busy" = true ] && echo "busy (others $(awk "BEGIN{printf \"%.0f\", 100*$share}")%)" || echo quiet)"
    [ "$busy" = true ] || errors="$errors $err"
  done
  median=$(echo "$errors" | tr ' ' '\n' | { grep -v '^$' || true; } | sort -g |
           awk '{v[NR]=$1} END{if(NR==0) print "n/a"; else if(NR%2) printf "%+.1f%%", v[(NR+1)/2]; else printf "%+.1f%%", (v[NR/2]+v[NR/2+1])/2}')
  summary="$summary$(printf '%-6s median step-time error over %d quiet runs: %s' "$name" \
    "$(echo "$errors" | wc -w)" "$median")\n"
done
printf '\n%b' "$summary"
