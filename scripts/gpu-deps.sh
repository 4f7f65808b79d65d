#!/usr/bin/env bash
# Run HERE (a Debian machine with network) before a GPU check: downloads, without installing, the
# Debian packages ptdp builds with into .gpu-deps/ (git-ignored, ~14 MB), because the lent GPU
# machine reaches no package registry. Pass `carry: [".gpu-deps"]` to the device run;
# scripts/gpu-check.sh unpacks them into .gpu-deps/root (never into /) when it has to build
# there, i.e. when the binaries carried from here (scripts/gpu-carry.sh) do not load.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu-deps
cd .gpu-deps
# Header-only packages, plus the few shared libraries ptdp links (yaml-cpp, fmt, benchmark).
apt-get download libyaml-cpp-dev libyaml-cpp0.7 libfmt-dev libfmt9 libboost1.74-dev \
  libboost-graph1.74-dev libgtest-dev libgmock-dev googletest libbenchmark-dev libbenchmark1debian \
  libcli11-dev nlohmann-json3-dev 2>&1 | grep -v "^W: Download is performed unsandboxed" || true
du -sh . && ls
