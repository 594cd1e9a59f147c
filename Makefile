# Top-level entry points. Every target does its own set-up (apt packages) first.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release

.PHONY: setup build demo test bench testbed clean

setup:
	@bash scripts/setup.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS)

build: setup $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	./$(BUILD)/concerto demo --trace $(BUILD)/demo_trace.json

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The emulated 1 Gbit/s cluster (root): measured vs simulated iteration times (docs/results.md).
testbed: build
	bash scripts/testbed.sh $(BUILD)

bench: build
	./$(BUILD)/concerto_bench
	./$(BUILD)/concerto_quality

clean:
	rm -rf $(BUILD)
