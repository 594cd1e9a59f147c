# Top-level entry points. Every target does its own set-up (apt packages) first.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

.PHONY: setup setup-torch build demo test bench testbed torchbed clean sanitize fuzz fuzz-smoke

setup:
	@bash scripts/setup.sh

# The venv with pip's torch 2.x (scripts/setup_torch.sh; made once per machine), handed to CMake
# for the torch engine's and the PyTorch bridge's tests.
setup-torch: setup $(BUILD)/build.ninja
	PY=$$(bash scripts/setup_torch.sh) && cmake -S . -B $(BUILD) -DCONCERTO_TORCH_PYTHON=$$PY

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

build: setup $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

# Builds only the tools (not the tests and benchmarks) before running the demo: the CLI, the
# MPI rank program `concerto run` launches and the Python module (README's tour uses all three).
demo: setup $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS) --target concerto_cli concerto_mpi_run concerto_python
	./$(BUILD)/concerto demo --trace $(BUILD)/demo_trace.json

test: setup-torch build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# AddressSanitizer + UndefinedBehaviorSanitizer build of the unit tests that
# cover the readers, verifiers, lowering, simulator, solvers and runtime (the
# whole suite does not fit CI's time under the sanitizers); any report fails.
# The listed tests build into one executable (sanitize_tests, a unity build in
# batches; CMakeLists.txt) that runs in $(JOBS) shards (scripts/sanitize_tests.sh).
SANITIZE_BUILD ?= build-sanitize
SANITIZE_TESTS ?= ir_test sharding_plan_test rank_session_test decompose_test lower_bound_test \
	transformer_lowering_test window_solver_test error_corpus_test reader_robustness_test plan_test \
	schedule_verifier_test simulator_test runtime_kernels_test fusion_test cost_model_test moe_lower_test \
	graph_index_test suggestions_test
# Left to `make test`: the CBC backend's three many-solve tests (about 50 of
# window_solver_test's 62 s under the sanitizers: CBC itself is not
# instrumented, the time is its solves; the CBC adapter's other tests still
# run) and ir_test's 100k-op round trip (50 s under ASan; the same reader paths
# as the small programs).
SANITIZE_EXCLUDE ?= Backends/BackendTest.SameProblemSameAnswer/cbc:Backends/BackendTest.MatchesBruteForceOnRandomSmallProblems/cbc:Backends/BackendTest.HintWithTinyTimeLimitIsNeverWorse/cbc:IrJson.HundredThousandOpsRoundTrip
# Built with clang (the same ASan + UBSan): its sanitizer builds are about a
# quarter faster here than g++'s (concerto_scheduler.cc 32.7 -> 23.1 s,
# transformer.cc 23.3 -> 13.7 s), which is CI's time; the listed tests include
# no driver header, so the driver library is not built either. The libraries
# build as unity builds too (CMAKE_UNITY_BUILD).
SANITIZE_CXX ?= clang++
# The same build carries the fuzzer's coverage (CONCERTO_FUZZ), so CI's
# sanitizer job also runs every libFuzzer target briefly (a smoke run from the
# seeds; make fuzz-smoke and docs/fuzzing.md for the long runs).
SANITIZE_FUZZ_SECONDS ?= 15
empty :=
space := $(empty) $(empty)
sanitize:
	@bash scripts/setup.sh clang
	CXX=$(SANITIZE_CXX) cmake -S . -B $(SANITIZE_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1" \
	  -DCONCERTO_SANITIZE=ON -DCONCERTO_FUZZ=ON -DCMAKE_UNITY_BUILD=ON \
	  -DCONCERTO_SANITIZE_TESTS="$(subst $(space),;,$(strip $(SANITIZE_TESTS)))"
	cmake --build $(SANITIZE_BUILD) -j $(JOBS) --target sanitize_tests $(FUZZ_TARGETS)
	bash scripts/sanitize_tests.sh $(SANITIZE_BUILD)/sanitize_tests $(JOBS) "$(SANITIZE_EXCLUDE)"
	bash scripts/fuzz.sh $(SANITIZE_BUILD) $(SANITIZE_FUZZ_SECONDS) $(FUZZ_TARGETS)

# libFuzzer targets (fuzz/, docs/fuzzing.md), built with clang and ASan +
# UBSan; fuzz-smoke runs each for FUZZ_SECONDS (60) and fails on any finding.
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 60
FUZZ_TARGETS ?= fuzz_program fuzz_schedule fuzz_plan fuzz_cluster fuzz_sharding fuzz_model fuzz_trace fuzz_profile
fuzz:
	@bash scripts/setup.sh clang
	CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -g1" -DCONCERTO_FUZZ=ON
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target $(FUZZ_TARGETS)

fuzz-smoke: fuzz
	bash scripts/fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# The emulated 1 Gbit/s cluster (root): measured vs simulated iteration times (docs/results.md).
testbed: build
	bash scripts/testbed.sh $(BUILD)

# concerto's schedules on the torch engine against torch's own DDP, FSDP and tensor parallelism
# (root: a shaped network namespace; about 30 minutes; docs/results.md). Not part of CI: CI runs
# its smoke (python_torchbed).
torchbed: setup-torch build
	bash scripts/torchbed.sh $(BUILD)

bench: build
	./$(BUILD)/concerto_bench
	./$(BUILD)/concerto_quality

clean:
	rm -rf $(BUILD)
