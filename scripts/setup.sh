#!/usr/bin/env bash
# Installs the Debian packages ptdp needs to build and test, and only those that are missing.
# Idempotent: a second run installs nothing and says so. Usage: scripts/setup.sh
# chromium is for the HTML report test (tests/cli/report_test.cc renders the page headless).
# OpenMPI (libopenmpi-dev, openmpi-bin) is the optional bootstrap of multi-process GPU runs
# (runtime/cuda/mpi_bootstrap.h; built when CUDA is found too).
# clang and libclang-rt-14-dev (libFuzzer and the sanitizer runtimes) are for `make fuzz-smoke`.
set -euo pipefail

pkgs=(cmake make g++ pkg-config libyaml-cpp-dev libfmt-dev libboost-graph-dev
      googletest libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
      chromium libopenmpi-dev openmpi-bin clang libclang-rt-14-dev)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#pkgs[@]} packages present, nothing to install"
  exit 0
fi

echo "setup: installing ${missing[*]}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: installed ${#missing[@]} package(s)"
