#!/usr/bin/env bash
# Installs Concerto's build dependencies from Debian packages. Idempotent: runs
# apt-get update at most once per call, and only when something is missing.
# Arguments: extra packages to install too (scripts/setup.sh clang).
set -euo pipefail
PKGS=(g++ make cmake ninja-build pkg-config lld
      nlohmann-json3-dev libcli11-dev libfmt-dev libyaml-cpp-dev
      libgtest-dev libgmock-dev libbenchmark-dev
      libgecode-dev coinor-libcbc-dev libopenblas-dev
      openmpi-bin libopenmpi-dev python3 python3-dev python3-pybind11 python3-venv)
# PyTorch comes from pip, in a venv made by scripts/setup_torch.sh (make test), not from here.
# Extra packages a target needs (make fuzz: clang, with libFuzzer).
PKGS+=("$@")
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "setup: all ${#PKGS[@]} packages present" >&2
  exit 0
fi
SUDO=""
[[ $(id -u) -eq 0 ]] || SUDO="sudo"
echo "setup: installing ${missing[*]}" >&2
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
