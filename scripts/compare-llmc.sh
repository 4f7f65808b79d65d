#!/usr/bin/env bash
# compare-llmc.sh LLMC_DIR [BUILD_DIR]
#
# Side-by-side CPU training throughput (tokens/s) of ptdp's 1x1x1 CPU runtime and llm.c's fp32
# CPU trainer (train_gpt2.c) at the same small GPT shapes on this machine (issues 4 and 11).
#
#   LLMC_DIR   an llm.c checkout (needs train_gpt2.c, llmc/, Makefile); it is only read: llm.c is
#              copied to and built in a temp dir, never inside this repository.
#   BUILD_DIR  the ptdp build to measure (default: build). If $NATIVE_BUILD (default:
#              build-native) holds a ptdp binary (cmake -DPTDP_NATIVE=ON), it is measured too.
#
# Environment: REPS (5; the median is reported), STEPS (20 per run; the first step is dropped),
# SHAPES ("s1 s2"), PAR (1: also run dp2 and tp2 with --gpus 2 on the default build), BASELINE
# (1: also run the default build's 1x1x1 with PTDP_CPU_KERNELS=baseline, the kernels a CPU
# without AVX2 gets). The load average is printed before and after: the machine may be shared.
# Shapes (vocab 256 bytes, B 4, GPT-2 style: gelu, layernorm, learned pos, tied, bias):
#   s1: L 4, C 128, NH 4, T 64     s2: L 6, C 384, NH 6, T 128
# llm.c gets a checkpoint with N(0, 0.02) weights and tinyshakespeare bytes as uint16 tokens,
# written in its binary formats by an embedded python3 snippet; its B and T (hard-coded in
# main) are patched in the temp copy, as are the step count, and validation/sampling are
# switched off (no tokenizer file). llm.c runs with OMP_NUM_THREADS=1 and 2 in one process;
# ptdp's 1x1x1 is one rank thread; dp2/tp2 are two rank threads.
set -euo pipefail

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 1 && $# -le 2 ]] || usage
LLMC_DIR=$(cd "$1" && pwd)
REPO=$(cd "$(dirname "$0")/.." && pwd)
BUILD_DIR=${2:-build}
[[ "$BUILD_DIR" = /* ]] || BUILD_DIR="$REPO/$BUILD_DIR"
NATIVE_BUILD=${NATIVE_BUILD:-build-native}
[[ "$NATIVE_BUILD" = /* ]] || NATIVE_BUILD="$REPO/$NATIVE_BUILD"
REPS=${REPS:-5}
STEPS=${STEPS:-20}
SHAPES=${SHAPES:-"s1 s2"}
PAR=${PAR:-1}
BASELINE=${BASELINE:-1}
B=4

PTDP="$BUILD_DIR/ptdp"
[[ -x "$PTDP" ]] || { echo "no ptdp binary at $PTDP (build it first)" >&2; exit 1; }
PTDP_NAT=""
[[ -x "$NATIVE_BUILD/ptdp" && "$NATIVE_BUILD" != "$BUILD_DIR" ]] && PTDP_NAT="$NATIVE_BUILD/ptdp"
for f in train_gpt2.c Makefile llmc/dataloader.h; do
  [[ -f "$LLMC_DIR/$f" ]] || { echo "$LLMC_DIR is not an llm.c checkout (no $f)" >&2; exit 1; }
done
CORPUS="$REPO/data/tinyshakespeare/input.txt"
CLUSTER="$REPO/configs/clusters/local-cpu.yaml"

WORK=$(mktemp -d /tmp/ptdp-llmc.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
echo "work dir: $WORK" >&2

shape() {  # name -> "L C NH T"
  case "$1" in
    s1) echo "4 128 4 64" ;;
    s2) echo "6 384 6 128" ;;
    *) echo "unknown shape $1" >&2; exit 1 ;;
  esac
}

median() { python3 -c 'import sys,statistics as s; v=[float(x) for x in sys.argv[1:]]; print("%.0f" % s.median(v) if v else "nan")' "$@"; }

# ---- llm.c: one patched copy + checkpoint + data per shape -------------------------------------
prep_llmc() {  # shape L C NH T
  local s=$1 L=$2 C=$3 NH=$4 T=$5 d="$WORK/llmc-$1"
  mkdir -p "$d/dev/data/tinyshakespeare"
  cp -r "$LLMC_DIR/train_gpt2.c" "$LLMC_DIR/Makefile" "$LLMC_DIR/llmc" "$d/"
  [[ -d "$LLMC_DIR/dev" ]] && cp -r "$LLMC_DIR/dev/"*.h "$d/dev/" 2>/dev/null || true
  sed -i -e "s/int B = 4;/int B = $B;/" -e "s/int T = 64;/int T = $T;/" \
         -e "s/step <= 40;/step <= $STEPS;/" \
         -e "s/if (step % 10 == 0) {/if (0) {/" \
         -e "s/if (step > 0 \&\& step % 20 == 0) {/if (0) {/" "$d/train_gpt2.c"
  grep -q "int T = $T;" "$d/train_gpt2.c" && grep -q "step <= $STEPS;" "$d/train_gpt2.c" \
    || { echo "patching llm.c train_gpt2.c failed" >&2; exit 1; }
  (cd "$d" && make train_gpt2 >"$d/make.log" 2>&1) || { cat "$d/make.log" >&2; exit 1; }
  python3 - "$d" "$L" "$C" "$NH" "$T" "$CORPUS" <<'PY'
import sys, struct, random, array, os
d, L, C, NH, T, corpus = sys.argv[1], *map(int, sys.argv[2:6]), sys.argv[6]
V = Vp = 256; maxT = T
rng = random.Random(1234)
sizes = [("w", Vp*C), ("w", maxT*C), ("1", L*C), ("0", L*C), ("w", L*3*C*C), ("0", L*3*C),
         ("w", L*C*C), ("0", L*C), ("1", L*C), ("0", L*C), ("w", L*4*C*C), ("0", L*4*C),
         ("w", L*C*4*C), ("0", L*C), ("1", C), ("0", C)]
with open(os.path.join(d, "gpt2_124M.bin"), "wb") as f:
    hdr = [0]*256
    hdr[:8] = [20240326, 3, maxT, V, L, NH, C, Vp]
    f.write(struct.pack("<256i", *hdr))
    for kind, n in sizes:
        if kind == "w":
            a = array.array("f", (rng.gauss(0.0, 0.02) for _ in range(n)))
        else:
            a = array.array("f", [1.0 if kind == "1" else 0.0]) * n
        a.tofile(f)
data = open(corpus, "rb").read()
cut = len(data) * 9 // 10
for name, toks in (("train", data[:cut]), ("val", data[cut:])):
    with open(os.path.join(d, "dev/data/tinyshakespeare/tiny_shakespeare_%s.bin" % name), "wb") as f:
        hdr = [0]*256
        hdr[:3] = [20240520, 1, len(toks)]
        f.write(struct.pack("<256i", *hdr))
        array.array("H", list(toks)).tofile(f)
PY
}

run_llmc() {  # shape T threads -> tok/s (mean step time over steps after the first)
  local d="$WORK/llmc-$1" T=$2 th=$3 log
  log="$WORK/llmc-$1-t$th.log"
  (cd "$d" && OMP_NUM_THREADS=$th OMP_PROC_BIND=false ./train_gpt2 >"$log" 2>&1) \
    || { tail -20 "$log" >&2; echo nan; return; }
  python3 - "$log" "$((B*T))" <<'PY'
import sys, re
ms = [float(m.group(2)) for m in re.finditer(r"step (\d+): train loss \S+ \(took ([\d.]+) ms\)", open(sys.argv[1]).read()) if int(m.group(1)) > 0]
print("%.1f" % (int(sys.argv[2]) * 1000.0 * len(ms) / sum(ms)) if ms else "nan")
PY
}

# ---- ptdp ----------------------------------------------------------------------------------------
prep_ptdp() {  # shape L C NH T
  local s=$1 L=$2 C=$3 NH=$4 T=$5
  cat >"$WORK/$s.yaml" <<EOF
name: cmp-$s
layers: $L
hidden: $C
heads: $NH
ffn_hidden: $((4*C))
seq_len: $T
vocab: 256
EOF
  local p
  for p in "1x1x1 1 1 1 $B" "dp2 2 1 2 $((B/2))" "tp2 2 2 1 $B"; do
    set -- $p
    "$PTDP" plan --cluster "$CLUSTER" --model "$WORK/$s.yaml" --gpus "$2" --global-batch "$B" \
      --micro-batch "$5" --tp "$3" --pp 1 --dp "$4" --recompute none --dist-opt off --refine 0 \
      --out "$WORK/$s-$1.plan.yaml" >"$WORK/$s-$1.plan.log" 2>&1 \
      || { cat "$WORK/$s-$1.plan.log" >&2; exit 1; }
    grep -q "tp: $3" "$WORK/$s-$1.plan.yaml" && grep -q "dp: $4" "$WORK/$s-$1.plan.yaml" \
      && grep -q "pp: 1" "$WORK/$s-$1.plan.yaml" \
      || { echo "plan $s-$1 is not the forced layout" >&2; exit 1; }
  done
}

run_ptdp() {  # binary shape layout T [kernels] -> tok/s
  local bin=$1 s=$2 lay=$3 T=$4 kernels=${5:-} out="$WORK/$2-$3.json"
  (cd "$REPO" && PTDP_CPU_KERNELS=${kernels:-${PTDP_CPU_KERNELS:-}} \
      "$bin" train "$WORK/$s-$lay.plan.yaml" --backend cpu --steps "$STEPS" \
      --corpus "$CORPUS" --out "$out" >"$WORK/$s-$lay.train.log" 2>&1) \
    || { tail -20 "$WORK/$s-$lay.train.log" >&2; echo nan; return; }
  python3 - "$out" "$((B*T))" <<'PY'
import sys, json
st = json.load(open(sys.argv[1]))["steps"][1:]
t = sum(s["step_time_s"] for s in st)
print("%.1f" % (int(sys.argv[2]) * len(st) / t) if t > 0 else "nan")
PY
}

# ---- measure -------------------------------------------------------------------------------------
declare -A R
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
for s in $SHAPES; do
  read -r L C NH T <<<"$(shape "$s")"
  echo "preparing $s (L $L, C $C, NH $NH, T $T, B $B, V 256)" >&2
  prep_llmc "$s" "$L" "$C" "$NH" "$T"
  prep_ptdp "$s" "$L" "$C" "$NH" "$T"
done
for r in $(seq 1 "$REPS"); do
  for s in $SHAPES; do
    read -r L C NH T <<<"$(shape "$s")"
    echo "rep $r/$REPS: $s" >&2
    R[$s,llmc1]+="$(run_llmc "$s" "$T" 1) "
    R[$s,llmc2]+="$(run_llmc "$s" "$T" 2) "
    R[$s,ptdp]+="$(run_ptdp "$PTDP" "$s" 1x1x1 "$T") "
    [[ -n "$PTDP_NAT" ]] && R[$s,nat]+="$(run_ptdp "$PTDP_NAT" "$s" 1x1x1 "$T") "
    [[ "$BASELINE" = 1 ]] && R[$s,base]+="$(run_ptdp "$PTDP" "$s" 1x1x1 "$T" baseline) "
    if [[ "$PAR" = 1 ]]; then
      R[$s,dp2]+="$(run_ptdp "$PTDP" "$s" dp2 "$T") "
      R[$s,tp2]+="$(run_ptdp "$PTDP" "$s" tp2 "$T") "
    fi
  done
done

# ---- table ---------------------------------------------------------------------------------------
ratio() { python3 -c 'import sys; a,b=map(float,sys.argv[1:]); print("%.2fx" % (a/b) if b > 0 and a == a else "-")' "$1" "$2"; }
echo
echo "median of $REPS runs, $STEPS steps each (first dropped), B $B, V 256; tokens/s"
echo "host: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "ptdp CPU kernels: $("$PTDP" info --json | python3 -c 'import sys,json; print(json.load(sys.stdin).get("cpu_kernels", "?"))')"
echo "load average (1, 5, 15 min): before $LOAD_BEFORE, after $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-26s %-8s %-18s %10s %10s %8s\n" shape threads ptdp llm.c ptdp ratio
for s in $SHAPES; do
  read -r L C NH T <<<"$(shape "$s")"
  desc="$s L$L C$C NH$NH T$T"
  l1=$(median ${R[$s,llmc1]}); l2=$(median ${R[$s,llmc2]})
  p=$(median ${R[$s,ptdp]})
  printf "%-26s %-8s %-18s %10s %10s %8s\n" "$desc" 1 "1x1x1 default" "$l1" "$p" "$(ratio "$p" "$l1")"
  if [[ -n "$PTDP_NAT" ]]; then
    n=$(median ${R[$s,nat]})
    printf "%-26s %-8s %-18s %10s %10s %8s\n" "$desc" 1 "1x1x1 native" "$l1" "$n" "$(ratio "$n" "$l1")"
  fi
  if [[ "$BASELINE" = 1 ]]; then
    b=$(median ${R[$s,base]})
    printf "%-26s %-8s %-18s %10s %10s %8s\n" "$desc" 1 "1x1x1 baseline" "$l1" "$b" "$(ratio "$b" "$l1")"
  fi
  printf "%-26s %-8s %-18s %10s %10s %8s\n" "$desc" 2 "1x1x1 default" "$l2" "$p" "$(ratio "$p" "$l2")"
  if [[ "$PAR" = 1 ]]; then
    for lay in dp2 tp2; do
      v=$(median ${R[$s,$lay]})
      printf "%-26s %-8s %-18s %10s %10s %8s  (%s over 1x1x1)\n" "$desc" 2 "$lay default" "$l2" "$v" \
        "$(ratio "$v" "$l2")" "$(ratio "$v" "$p")"
    done
  fi
  echo "  llm.c 2-thread speed-up over 1 thread: $(ratio "$l2" "$l1")"
done
