#!/usr/bin/env bash
# The main job on the bundled example: plan a layout, simulate the chosen plan step by step
# (Perfetto trace), write the HTML report, and train a plan for real on the CPU runtime.
# (compare joins this chain with issue 6: see README.md "Status".)
set -euo pipefail
build="${1:-build}"
ptdp="$build/ptdp"
out="${DEMO_OUT:-$build/demo}"
mkdir -p "$out"

echo "== 1. plan: GPT-3 175B on 128 DGX A100 nodes (1024 GPUs), global batch 1536"
"$ptdp" plan --cluster configs/clusters/dgx-a100.yaml --model configs/models/gpt3-175b.yaml \
  --global-batch 1536 --top 5 --out "$out/gpt3-175b.plan.yaml"
echo
echo "== 2. simulate the chosen plan (event-driven), with a Perfetto trace"
"$ptdp" simulate "$out/gpt3-175b.plan.yaml" --trace "$out/gpt3-175b.trace.json"
echo
echo "== 2b. a small pipeline in the terminal: GPT-3 175B, tp 8, pp 4, 8 micro-batches"
"$ptdp" simulate --cluster configs/clusters/dgx-a100.yaml --model configs/models/gpt3-175b.yaml \
  --global-batch 8 --nodes 4 --tp 8 --pp 4 --timeline --width 80 | sed -n '/^rank 0 /,$p'
echo
echo "== 3. plan gpt-tiny on this machine's 4 CPU rank slots (tp 2 x pp 2), and train it"
"$ptdp" plan --cluster configs/clusters/local-cpu.yaml --model configs/models/gpt-tiny.yaml \
  --global-batch 8 --gpus 4 --tp 2 --pp 2 --top 3 --out "$out/gpt-tiny.plan.yaml"
echo
"$ptdp" train "$out/gpt-tiny.plan.yaml" --backend cpu --steps 30 --out "$out/gpt-tiny.measured.json"
echo
echo "== 4. the Megatron-LM command line for the 175B plan"
"$ptdp" plan --cluster configs/clusters/dgx-a100.yaml --model configs/models/gpt3-175b.yaml \
  --global-batch 1536 --top 1 --emit megatron | sed -n '/^torchrun/,$p'
echo
echo "== 5. the HTML report"
"$ptdp" report --cluster configs/clusters/dgx-a100.yaml --model configs/models/gpt3-175b.yaml \
  --global-batch 1536 --html "$out/gpt3-175b.report.html"
echo
echo "plans, trace, report and measured.json written to $out/"
