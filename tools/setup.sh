#!/usr/bin/env bash
# Installs every Debian 12 package memgrad needs (idempotent: already-installed packages
# are skipped). CUDA is not in Debian: when /usr/local/cuda exists it is used, otherwise
# the CPU-only build is made.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap bazel-rules-java build-essential
  libgtest-dev libbenchmark-dev libeigen3-dev zlib1g-dev nlohmann-json3-dev
  dataset-fashion-mnist python3 clang-format cmake ccache
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: CUDA toolkit found at /usr/local/cuda ($(/usr/local/cuda/bin/nvcc --version | tail -2 | head -1))"
else
  echo "setup: no CUDA toolkit at /usr/local/cuda: building the CPU backend only"
fi
