#!/usr/bin/env bash
# Installs the build in BUILD into a fresh prefix and builds examples/consumer
# against it twice: with CMake (find_package(Concerto COMPONENTS core), linking
# only Concerto::core) and with pkg-config (concerto-core); runs both and
# checks that the core archive is all they link of Concerto.
# Usage: check_consumer.sh BUILD_DIR SOURCE_DIR   (the CTest consumer_package)
set -euo pipefail
BUILD="$(realpath "$1")"
SRC="$(realpath "$2")"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
cmake --install "$BUILD" --prefix "$TMP/prefix" >"$TMP/install.log"
EXAMPLE="$SRC/examples/ir/dp_matmul_allreduce.json"

cmake -S "$SRC/examples/consumer" -B "$TMP/build" -G Ninja -DCMAKE_PREFIX_PATH="$TMP/prefix" >"$TMP/configure.log" \
  || { cat "$TMP/configure.log"; exit 1; }
cmake --build "$TMP/build" -- -v >"$TMP/build.log" 2>&1 || { cat "$TMP/build.log"; exit 1; }
link_line="$(grep -E 'simulate_fifo( |$)' "$TMP/build.log" | grep -- ' -o simulate_fifo' || true)"
for lib in concerto_schedule concerto_runtime concerto_driver concerto_lower gecode cbc Cbc openblas mpi; do
  if grep -q "$lib" <<<"$link_line"; then
    echo "consumer: the Concerto::core consumer links $lib:"; echo "$link_line"; exit 1
  fi
done
grep -q "libconcerto_core.a" <<<"$link_line" || { echo "consumer: libconcerto_core.a not linked:"; echo "$link_line"; exit 1; }
"$TMP/build/simulate_fifo" "$EXAMPLE" | tee "$TMP/cmake.out"
grep -q "iteration" "$TMP/cmake.out"

export PKG_CONFIG_PATH="$TMP/prefix/lib/pkgconfig:$TMP/prefix/lib/x86_64-linux-gnu/pkgconfig:${PKG_CONFIG_PATH:-}"
# shellcheck disable=SC2046
c++ -O1 "$SRC/examples/consumer/simulate_fifo.cc" -o "$TMP/simulate_fifo_pc" $(pkg-config --cflags --libs concerto-core)
"$TMP/simulate_fifo_pc" "$EXAMPLE" | tee "$TMP/pc.out"
cmp "$TMP/cmake.out" "$TMP/pc.out"
# Every component: Concerto::concerto links with its solver, BLAS and MPI
# dependencies found by the package config alone.
mkdir -p "$TMP/all"
cat >"$TMP/all/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.25)
project(concerto_all LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(Concerto REQUIRED)
add_executable(all_components main.cc)
target_link_libraries(all_components PRIVATE Concerto::concerto)
CMAKE
cat >"$TMP/all/main.cc" <<'CC'
#include <cstdio>
#include "concerto/driver/job.h"
int main() {
  concerto::JobSpec spec;
  spec.model = "gpt-tiny";
  spec.scheduler = "concerto";
  concerto::Result<concerto::JobResult> job = concerto::RunJob(spec);
  if (!job.ok()) { std::fprintf(stderr, "%s\n", job.status().message().c_str()); return 1; }
  std::printf("all components: gpt-tiny concerto %.3f us\n", job->run.summary.makespan_us);
  return 0;
}
CC
cmake -S "$TMP/all" -B "$TMP/all/build" -G Ninja -DCMAKE_PREFIX_PATH="$TMP/prefix" >"$TMP/all.log" 2>&1 \
  && cmake --build "$TMP/all/build" >>"$TMP/all.log" 2>&1 || { cat "$TMP/all.log"; exit 1; }
"$TMP/all/build/all_components"

echo "consumer: ok (CMake Concerto::core and pkg-config concerto-core, $(pkg-config --modversion concerto-core))"
