#!/usr/bin/env bash
# Makes the virtual environment with PyTorch 2.x (pip) that the torch engine, the PyTorch bridge
# and their tests run in: python/requirements-torch.txt into a venv made from Debian's python3
# (the interpreter the native module is built for, same ABI). `make test` runs it; `make demo`
# does not need it.
#
# The venv lives once per machine (CONCERTO_VENV, default ~/.cache/concerto/torch-venv), outside
# any clone, so CI's fresh clones reuse it: a stamp file holds the requirements it was made from,
# and a venv whose stamp differs is made anew. Prints the venv's interpreter on stdout and how
# long the install took on stderr (first install here: about 90 s and 5 GB, torch's CUDA wheels
# included; later runs: nothing to do).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${CONCERTO_VENV:-$HOME/.cache/concerto/torch-venv}
REQ=python/requirements-torch.txt
if [[ -x $VENV/bin/python && -f $VENV/.concerto-requirements ]] && cmp -s "$REQ" "$VENV/.concerto-requirements"; then
  echo "setup_torch: $VENV is up to date" >&2
  echo "$VENV/bin/python"
  exit 0
fi
if ! /usr/bin/python3 -m venv --help > /dev/null 2>&1; then
  bash scripts/setup.sh python3-venv >&2
fi
start=$(date +%s)
echo "setup_torch: making $VENV from $REQ" >&2
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
/usr/bin/python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQ" >&2
"$VENV/bin/python" -c "import torch, torchvision, transformers" >&2
cp "$REQ" "$VENV/.concerto-requirements"
echo "setup_torch: installed in $(( $(date +%s) - start )) s ($(du -sh "$VENV" | cut -f1))" >&2
echo "$VENV/bin/python"
