#!/usr/bin/env bash
# The main job on the bundled example: plan a layout, simulate the chosen plan step by step
# (Perfetto trace), write the HTML report; then close the loop on this machine: calibrate it,
# plan gpt-tiny on the calibrated cluster, train the plan and the other layouts that fit 2 cores
# (cp 2, tp 2 with selective recompute and gpt-tiny-moe at ep 2 among them)
# on the CPU runtime, compare each with its prediction, and report predicted against measured.
set -euo pipefail
# Shipped configs are named (dgx-a100, gpt3-175b): the binary finds them beside itself.
build="${1:-build}"
ptdp="$build/ptdp"
out="${DEMO_OUT:-$build/demo}"
mkdir -p "$out"

echo "== 1. plan: GPT-3 175B on 128 DGX A100 nodes (1024 GPUs), global batch 1536"
"$ptdp" plan --cluster dgx-a100 --model gpt3-175b \
  --global-batch 1536 --top 5 --out "$out/gpt3-175b.plan.yaml"
echo
echo "== 2. simulate the chosen plan (event-driven), with a Perfetto trace"
"$ptdp" simulate "$out/gpt3-175b.plan.yaml" --trace "$out/gpt3-175b.trace.json"
echo
echo "== 2b. a small pipeline in the terminal: GPT-3 175B, tp 8, pp 4, 8 micro-batches"
"$ptdp" simulate --cluster dgx-a100 --model gpt3-175b \
  --global-batch 8 --nodes 4 --tp 8 --pp 4 --timeline --width 80 | sed -n '/^rank 0 /,$p'
echo
echo "== 3. close the loop on this machine: calibrate (short), plan gpt-tiny on the calibrated"
echo "      cluster, train the chosen plan, compare it with its prediction"
cal="$out/local-cpu.calibrated.yaml"
"$ptdp" calibrate --backend cpu --quick --out "$cal"
echo
"$ptdp" plan --cluster "$cal" --model gpt-tiny --global-batch 8 --gpus 2 \
  --recompute none --top 3 --out "$out/gpt-tiny.plan.yaml"
echo
"$ptdp" train "$out/gpt-tiny.plan.yaml" --backend cpu --steps 30 --out "$out/gpt-tiny.measured.json"
echo
"$ptdp" compare "$out/gpt-tiny.plan.yaml" "$out/gpt-tiny.measured.json"
echo
echo "== 3b. the other layouts that fit 2 cores, each trained and compared"
# name:model:flags (context parallelism, recompute and MoE with expert parallelism included)
for layout in "1x1x1:gpt-tiny:--gpus 1" "tp2:gpt-tiny:--gpus 2 --tp 2" \
              "pp2:gpt-tiny:--gpus 2 --pp 2" "dp2:gpt-tiny:--gpus 2 --dp 2" \
              "cp2:gpt-tiny:--gpus 2 --cp 2" \
              "tp2-selective:gpt-tiny:--gpus 2 --tp 2 --recompute selective" \
              "ep2:gpt-tiny-moe:--gpus 2 --ep 2"; do
  name="${layout%%:*}"
  rest="${layout#*:}"
  model="${rest%%:*}"
  flags="${rest#*:}"
  case "$flags" in *--recompute*) ;; *) flags="$flags --recompute none" ;; esac
  # shellcheck disable=SC2086  # the flags are words
  "$ptdp" plan --cluster "$cal" --model "$model" --global-batch 8 \
    $flags --top 1 --out "$out/gpt-tiny-$name.plan.yaml" > /dev/null
  "$ptdp" train "$out/gpt-tiny-$name.plan.yaml" --steps 12 --timing-warmup 2 \
    --out "$out/gpt-tiny-$name.measured.json" > /dev/null
  "$ptdp" compare "$out/gpt-tiny-$name.plan.yaml" "$out/gpt-tiny-$name.measured.json" |
    grep -E "^(summary|other processes)"
done
echo
echo "== 3c. the HTML report of the chosen plan with its measured run (predicted against measured)"
"$ptdp" report "$out/gpt-tiny.plan.yaml" --measured "$out/gpt-tiny.measured.json" \
  --html "$out/gpt-tiny.report.html"
echo
echo "== 4. the Megatron-LM command line for the 175B plan"
"$ptdp" plan --cluster dgx-a100 --model gpt3-175b \
  --global-batch 1536 --top 1 --emit megatron | sed -n '/^# Megatron-LM launch/,$p'
echo
echo "== 5. the HTML report"
"$ptdp" report --cluster dgx-a100 --model gpt3-175b \
  --global-batch 1536 --html "$out/gpt3-175b.report.html"
echo
echo "plans, trace, reports, the calibrated cluster and measured.json files written to $out/"
