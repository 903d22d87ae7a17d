#!/usr/bin/env bash
# Installs every Debian package stoker needs to build, test and benchmark.
# Idempotent: runs apt-get (and its update) only when something is missing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev
  libfuse3-dev fuse3
  libjpeg62-turbo-dev libpng-dev zlib1g-dev
  clang libclang-rt-14-dev clang-format
  pybind11-dev python3-dev python3-numpy python3-pytest python3-pytest-timeout
  python3-torch python3-torchvision python3-pil
  python3-distributed python3-cryptography
  plasma-workspace-wallpapers
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi
