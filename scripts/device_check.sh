#!/usr/bin/env bash
# The prepared check for a lent GPU (scripts/device_check.py: the torch engine on the device, GEMM
# efficiency against the cost model, a GEMM beside a copy; under 10 minutes on one H100), or its
# dry run on the CPU for CI (--dry-run: under a minute).
#
#   bash scripts/device_check.sh [--dry-run] [--out DIR] [--build DIR] [-- MORE ARGS FOR device_check.py]
#
# --out: where device_check.json, device_check.md and h100_profile.json go (default
# <repo>/device_check_out). --build: the build folder whose python/ holds the native module
# (default <repo>/build). Relative paths are taken from the current directory.
# Interpreter: $CONCERTO_TORCH_PYTHON, else ~/.cache/concerto/torch-venv/bin/python (made by
# scripts/setup_torch.sh) if it exists, else python3.
# Exit status: 0 every check passed, 1 a check failed, 2 no CUDA device without --dry-run (or bad
# arguments).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=$ROOT/device_check_out
BUILD=$ROOT/build
ARGS=()
usage() { sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --dry-run) ARGS+=(--dry-run); shift ;;
    --out) [[ $# -ge 2 ]] || { echo "device_check: --out needs a folder" >&2; exit 2; }; OUT=$2; shift 2 ;;
    --out=*) OUT=${1#--out=}; shift ;;
    --build) [[ $# -ge 2 ]] || { echo "device_check: --build needs a folder" >&2; exit 2; }; BUILD=$2; shift 2 ;;
    --build=*) BUILD=${1#--build=}; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; ARGS+=("$@"); break ;;
    *) echo "device_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
abspath() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
OUT=$(abspath "$OUT")
BUILD=$(abspath "$BUILD")

if [[ -n ${CONCERTO_TORCH_PYTHON:-} ]]; then
  PY=$CONCERTO_TORCH_PYTHON
elif [[ -x $HOME/.cache/concerto/torch-venv/bin/python ]]; then
  PY=$HOME/.cache/concerto/torch-venv/bin/python
else
  PY=python3
fi
if [[ ! -d $BUILD/python/concerto ]]; then
  echo "device_check: $BUILD/python/concerto does not exist (build the project, or pass --build DIR)" >&2
  exit 1
fi
export PYTHONPATH=$BUILD/python${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUT"
echo "device_check: interpreter $PY, module from $BUILD/python, writing to $OUT" >&2
exec "$PY" "$ROOT/scripts/device_check.py" --out "$OUT" ${ARGS[@]+"${ARGS[@]}"}
