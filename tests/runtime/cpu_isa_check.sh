#!/usr/bin/env bash
# cpu_isa_check.sh BINARY
#
# Proves that a portable (no -march) x86-64 build keeps its AVX code where only the dispatcher
# can reach it (runtime/cpu/cpu_kernels.h): disassembles BINARY and fails if any function outside
# the CPU kernels' avx2/avx512 namespaces has a VEX or EVEX instruction (v-prefixed mnemonics,
# ymm/zmm or mask registers), or if an avx2 function uses AVX-512 (zmm, k0-k7, xmm16-31 or
# ymm16-31). Such code would die with SIGILL on a CPU without those instructions, or would mean
# that a wide copy of some shared inline function got linked in for everyone. It also checks that
# the avx2 and avx512 kernels are there at all. Exit 77 (skipped) without objdump.
set -euo pipefail
[[ $# -eq 1 && -f "$1" ]] || { echo "usage: $0 BINARY" >&2; exit 2; }
command -v objdump >/dev/null || { echo "objdump not found: skipped"; exit 77; }

objdump -d --no-show-raw-insn -C "$1" | awk '
  # A function: "0000000000401000 <name>:"
  /^[0-9a-f]+ <.*>:$/ {
    fn = substr($0, index($0, "<") + 1); sub(/>:$/, "", fn)
    kind = fn ~ /ptdp::rt::\(anonymous namespace\)::avx512::/ ? "avx512" \
         : fn ~ /ptdp::rt::\(anonymous namespace\)::avx2::/ ? "avx2" : "baseline"
    next
  }
  # An instruction: "  401000:<TAB>mnemonic operands"
  /^ +[0-9a-f]+:\t/ {
    split($0, f, "\t"); insn = f[2]; split(insn, w, " "); op = w[1]
    vex = op ~ /^v/ || insn ~ /%[yz]mm|%k[0-7]/
    evex = insn ~ /%zmm|%k[0-7]|%[xy]mm(1[6-9]|2[0-9]|3[01])([^0-9]|$)/
    if (kind == "avx512") { wide512++; next }
    if (kind == "avx2") { if (insn ~ /%ymm/) wide2++; if (evex && !(fn in bad2)) { bad2[fn] = insn; n2++ }; next }
    if (vex && !(fn in bad)) { bad[fn] = insn; nb++ }
  }
  END {
    for (fn in bad) printf "AVX instruction outside the kernels: %s: %s\n", fn, bad[fn]
    for (fn in bad2) printf "AVX-512 instruction in an avx2 kernel: %s: %s\n", fn, bad2[fn]
    if (wide512 == 0) print "no avx512 kernels found (were they renamed?)"
    if (wide2 == 0) print "no avx2 kernels with ymm registers found (were they renamed?)"
    if (nb + n2 > 0 || wide512 == 0 || wide2 == 0) exit 1
    printf "ok: AVX only in the avx2 (%d ymm instructions) and avx512 (%d instructions) kernels\n", wide2, wide512
  }'
