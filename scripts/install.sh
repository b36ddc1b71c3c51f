#!/usr/bin/env bash
# Installs everything dscpp needs on Debian 12: Debian packages by apt, Python packages
# by pip into the project's own virtual environment (.venv). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo

packages=(build-essential clang cmake ninja-build ccache git python3-venv python3-dev
  nlohmann-json3-dev libfmt-dev libboost-program-options-dev googletest libgtest-dev
  libgloo-dev fortunes zlib1g-dev
  libyaml-cpp-dev  # config/: model configs as YAML
  libclang-rt-14-dev  # tests/fuzz: libFuzzer, ASan and UBSan for clang
  libprotobuf-dev protobuf-compiler  # runtime/monitor: TensorBoard event records
  liburing-dev  # zero/: ZeRO-Infinity's NVMe swap files through io_uring
  iso-codes  # tests/data: text in ~150 languages (gettext catalogs) for the tokenizer test
  iproute2 openssh-server openssh-client pdsh)  # tests/comm: two hosts as network namespaces
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "dscpp install: apt packages: ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python3 ]; then
  /usr/bin/python3 -m venv .venv
fi
pip=".venv/bin/pip --disable-pip-version-check -q"
# Every import requirements.txt provides, so that a package added there reaches old .venvs too.
if ! .venv/bin/python3 -c "import torch, numpy, wheel, tokenizers, tensorboard, transformers, safetensors" 2>/dev/null; then
  echo "dscpp install: torch, numpy and the test references into .venv (large the first time)"
  $pip install -r requirements.txt
fi
if ! .venv/bin/python3 -c "import deepspeed" 2>/dev/null; then
  echo "dscpp install: deepspeed into .venv (CPU only, no ops compiled)"
  DS_BUILD_OPS=0 $pip install --no-build-isolation -r requirements-deepspeed.txt
fi
echo "dscpp install: done"
