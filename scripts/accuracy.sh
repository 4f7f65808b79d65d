#!/usr/bin/env bash
# How well the calibrated cost model predicts this machine: calibrate it, then train each CPU
# layout that fits 2 cores (gpt-tiny at 1x1x1, tp 2, pp 2, dp 2, cp 2, tp 2 with selective and
# cp 2 with full recompute; gpt-tiny-moe at ep 2) until RUNS runs were quiet, and compare every
# run with its prediction. ep 2's error is the prediction at the expert load the run measured
# (compare's expert_load; the error at the planned load is printed beside it). A run is busy
# when other processes took cores its ranks needed (a calibration: more than 10% of the cores)
# meanwhile (`ptdp train`/`calibrate` measure it); busy runs are printed but left out of the
# medians, and retried after a pause (up to 4 x RUNS attempts). A calibration whose sweeps ran
# more than 15% apart (calibrate's host_unsteady) is taken again too, up to 5 times.
# Prints each run's step-time and memory errors, then per layout the median over the quiet runs:
# the figures of docs/cost-model.md, "Measured primitives". "at speed" is compare's error at the
# host's speed during the run (host_speed: train's speed probe against the calibration), the
# cost model's own error once the host's drift since calibration is taken out.
#
#   scripts/accuracy.sh [build] [runs] [--quick]     e.g. scripts/accuracy.sh build 5
set -euo pipefail
build="${1:-build}"
runs="${2:-5}"
quick="${3:-}"
ptdp="$build/ptdp"
out="${ACCURACY_OUT:-$build/accuracy}"
mkdir -p "$out"

# A top-level value from a `--json` output (nlohmann's dump(2): one "key": value per line, two
# spaces in); `load` the one of compare's expert_load object.
field() { grep -m1 "^  \"$1\":" "$2" | sed -E 's/.*: ([^,]*),?$/\1/'; }
load() { sed -n '/^  "expert_load": {/,/^  }/p' "$2" | grep -m1 "\"$1\":" | sed -E 's/.*: ([^,]*),?$/\1/'; }
speed() { sed -n '/^  "host_speed": {/,/^  }/p' "$2" | grep -m1 "^    \"$1\":" | sed -E 's/.*: ([^,]*),?$/\1/'; }
# The median of a list of numbers, as a signed percentage; n/a for none.
Median() {
  echo "$1" | tr ' ' '\n' | { grep -v '^$' || true; } | sort -g |
    awk '{v[NR]=$1} END{if(NR==0) print "n/a"; else if(NR%2) printf "%+.1f%%", v[(NR+1)/2]; else printf "%+.1f%%", (v[NR/2]+v[NR/2+1])/2}'
}
pct() { awk "BEGIN{printf \"%.0f\", 100*$1}"; }

for attempt in 1 2 3 4 5; do
  "$ptdp" calibrate --backend cpu $quick --json --out "$out/calibrated.yaml" 2> /dev/null \
    > "$out/calibrate.json"
  busy=$(field machine_busy "$out/calibrate.json")
  unsteady=$(field host_unsteady "$out/calibrate.json")
  [ "$busy" = true ] || [ "$unsteady" = true ] || break
  if [ "$busy" = true ]; then
    echo "calibration $attempt: busy (others used $(pct "$(field other_cpu_share "$out/calibrate.json")")% of the cores); again in 10 s"
  else
    echo "calibration $attempt: the host's speed moved $(pct "$(field host_drift "$out/calibrate.json")")% between its sweeps; again in 10 s"
  fi
  sleep 10
done
echo "calibrated in $(field elapsed_s "$out/calibrate.json") s: $out/calibrated.yaml"

printf '%-8s %4s %12s %12s %10s %10s %10s %s\n' layout run predicted measured "step err" "at speed" "mem err" machine
summary=""
tiny=configs/models/gpt-tiny.yaml
moe=configs/models/gpt-tiny-moe.yaml
for layout in "1x1x1:$tiny:--gpus 1" "tp2:$tiny:--gpus 2 --tp 2" "pp2:$tiny:--gpus 2 --pp 2" \
              "dp2:$tiny:--gpus 2 --dp 2" "cp2:$tiny:--gpus 2 --cp 2" \
              "tp2-sel:$tiny:--gpus 2 --tp 2 --recompute selective" \
              "cp2-full:$tiny:--gpus 2 --cp 2 --recompute full" "ep2:$moe:--gpus 2 --ep 2"; do
  name="${layout%%:*}"
  rest="${layout#*:}"
  model="${rest%%:*}"
  flags="${rest#*:}"
  case "$flags" in *--recompute*) ;; *) flags="$flags --recompute none" ;; esac
  plan="$out/$name.plan.yaml"
  # shellcheck disable=SC2086  # the flags are words
  "$ptdp" plan --cluster "$out/calibrated.yaml" --model "$model" \
    --global-batch 8 $flags --top 1 --out "$plan" > /dev/null
  errors=""
  at_speed_errors=""
  quiet=0
  for run in $(seq 1 $((4 * runs))); do
    [ "$quiet" -lt "$runs" ] || break
    "$ptdp" train "$plan" --steps 12 --timing-warmup 2 --out "$out/$name.$run.json" > /dev/null
    c="$out/$name.$run.compare.json"
    "$ptdp" compare "$plan" "$out/$name.$run.json" --json > "$c"
    busy=$(field machine_busy "$c")
    err=$(field step_time_error_pct "$c")
    predicted=$(field predicted_step_time_s "$c")
    at_load=""
    if [ -n "$(load step_time_error_pct "$c")" ]; then  # MoE: at the measured expert load
      at_load=" (planned load $(printf '%+.1f' "$err")%, measured load $(load measured "$c"))"
      err=$(load step_time_error_pct "$c")
      predicted=$(load predicted_step_time_s "$c")
    fi
    at_speed=$(speed step_time_error_pct "$c")
    printf '%-8s %4s %9.2f ms %9.2f ms %+9.1f%% %9s %+9.1f%% %s%s\n' "$name" "$run" \
      "$(awk "BEGIN{print 1000*$predicted}")" \
      "$(awk "BEGIN{print 1000*$(field measured_step_time_s "$c")}")" "$err" \
      "$( [ -n "$at_speed" ] && printf '%+.1f%%' "$at_speed" || echo n/a)" \
      "$(field memory_error_pct "$c")" \
      "$( [ "$busy" = true ] && echo "busy (others $(pct "$(field other_cpu_share "$c")")%)" || echo quiet)" \
      "$at_load"
    if [ "$busy" = true ]; then
      sleep 5
    else
      errors="$errors $err"
      at_speed_errors="$at_speed_errors $at_speed"
      quiet=$((quiet + 1))
    fi
  done
  median=$(Median "$errors")
  summary="$summary$(printf '%-8s median step-time error over %d quiet runs: %s; at the host speed of each run: %s' "$name" "$quiet" "$median" "$(Median "$at_speed_errors")")\n"
done
printf '\n%b' "$summary"
