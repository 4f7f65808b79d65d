# ptdp: `make` builds, `make test` runs every test, `make demo` runs the main job on the
# bundled example, `make bench` runs the benchmarks. Each target installs what is missing first.
# `make test-asan` runs the suite once more (less ASAN_EXCLUDE) built with AddressSanitizer and
# UndefinedBehaviorSanitizer; `make test-tsan` runs the multi-rank runtime tests (every layout
# against 1x1x1, resume, reshard, the communicators) built with ThreadSanitizer; `make fuzz-smoke`
# runs every libFuzzer target briefly (all three in CI).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
TSAN_FILTER ?= Trainer.*:GradReducer.*:Trainer/*:Reshard.*:ImportState.*:NonFinite.*:ThreadComm*:GptChunk.*:Gpt/*:TrainerSplit.*:Runtime/TrainerSplit.*:Bf16Training.*:PhaseTiming.*:Sharded*:Runtime/ShardedCheckpoint.*
# Debug (assertions on) at -O1: sanitizer reports stop the test (-fno-sanitize-recover=all).
ASAN_FLAGS ?= -O1 -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
FUZZ_SECONDS ?= 30
# Left out of the sanitizer run only: the planner's every-layout sweep over five of the shipped
# clusters (the same code paths as dgx-h100 and gb200-nvl72, which stay: ~410 s of the run's
# test time, instrumented). `make test` runs all of them.
# The CUDA emulator's tests run there too (the kernels under the sanitizers, built from the CUDA
# headers without nvcc: ~3 minutes of instrumented test time), less the trainer's (6 minutes
# instrumented, measured) and the second and third schedules; `make test` runs them.
# Also left out there: the two calibration runs that time the host for minutes instrumented
# (Compare.HoldsTheHostSpeedAgainstTheCalibration 198 s, Calibrate.RecordsTheCommunicator 169 s
# on 2026-12-07; the other Compare and Calibrate tests run the same code under the sanitizers).
ASAN_EXCLUDE ?= ^ShippedClusters/FiniteEstimates\.EveryShippedModel/(dgx_a100|dgx_b200|dgx_b300|dgx_h200|gb300_nvl72)( |$$)|^emu\.(CudaTrainer|OneGpu)|^cuda_backend_emu_test\.|^Compare\.HoldsTheHostSpeedAgainstTheCalibration$$|^Calibrate\.RecordsTheCommunicator$$

.PHONY: all setup configure build test test-asan test-tsan fuzz-smoke demo bench clean

all: build

setup:
	@bash scripts/setup.sh

configure: setup
	@echo "== configuring $(BUILD)/ (cmake; log in $(BUILD).configure.log)"
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) > $(BUILD).configure.log 2>&1 || (cat $(BUILD).configure.log; exit 1)

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

test-asan: setup
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DPTDP_CUDA=OFF -DPTDP_CUDA_EMULATOR=ON \
	  -DPTDP_BUILD_BENCH=OFF \
	  -DCMAKE_CXX_FLAGS="$(ASAN_FLAGS)" > $(ASAN_BUILD).configure.log 2>&1 \
	  || (cat $(ASAN_BUILD).configure.log; exit 1)
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j $(JOBS) \
	  -E '$(ASAN_EXCLUDE)'

test-tsan: setup
	@cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPTDP_CUDA=OFF -DPTDP_BUILD_BENCH=OFF \
	  -DCMAKE_CXX_FLAGS="-O1 -g -fsanitize=thread" > $(TSAN_BUILD).configure.log 2>&1 \
	  || (cat $(TSAN_BUILD).configure.log; exit 1)
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target runtime_test
	@TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 $(TSAN_BUILD)/tests/runtime/runtime_test \
	  --gtest_brief=1 --gtest_filter='$(TSAN_FILTER)'

fuzz-smoke: setup
	@bash scripts/fuzz.sh $(FUZZ_SECONDS)

# The demo builds only what it runs (the ptdp binary); `make test` builds the rest.
demo: configure
	@echo "== building the ptdp binary (only what the demo runs; make test builds the tests too)"
	@cmake --build $(BUILD) -j $(JOBS) --target ptdp
	@bash scripts/demo.sh $(BUILD)

bench: build
	@bash scripts/bench.sh $(BUILD)

clean:
	rm -rf $(BUILD) $(BUILD).configure.log $(ASAN_BUILD) $(ASAN_BUILD).configure.log \
	  $(TSAN_BUILD) $(TSAN_BUILD).configure.log build-fuzz build-fuzz.configure.log
