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
  lld  # the linker where the compiler can use it: links in less than half GNU ld's time
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
if ! .venv/bin/python3 -c "import torch, numpy, wheel, tokenizers, tensorboard, transformers, safetensors, torchao" 2>/dev/null; then
  echo "dscpp install: torch, numpy and the test references into .venv (large the first time)"
  $pip install -r requirements.txt
fi
if ! .venv/bin/python3 -c "import deepspeed" 2>/dev/null; then
  echo "dscpp install: deepspeed into .venv (CPU only, no ops compiled)"
  DS_BUILD_OPS=0 $pip install --no-build-isolation -r requirements-deepspeed.txt
fi

# DeepSpeed's CPU ops that the tests load, JIT-built here once instead of inside whichever test
# loads them first (g++ -O3 -g over LibTorch's headers: minutes of 2 cores each): its shared-
# memory collectives, which every CPU DeepSpeed run initialises, and DeepSpeedCPUAdam (tests/ops).
# Into build/torch_extensions, the TORCH_EXTENSIONS_DIR every test gets (tests/CMakeLists.txt),
# so a test finds them up to date and loads them in a second. The compiler is still `c++`, the
# ninja file the tests' loads write is the same, but it resolves to ccache's: with paths taken
# relative to the checkout (and the CPU's flags hashed, for -march=native), a fresh clone's build
# is cache hits.
ext="$PWD/build/torch_extensions"
mkdir -p "$ext"
grep -m1 '^flags' /proc/cpuinfo >"$ext/cpu_flags" || true
ccache_path=""
[ -x /usr/lib/ccache/c++ ] && ccache_path="/usr/lib/ccache:"
echo "dscpp install: DeepSpeed's CPU ops (cpu_adam, shm comm) into build/torch_extensions"
PATH="$ccache_path$PATH" TORCH_EXTENSIONS_DIR="$ext" DS_ACCELERATOR=cpu \
  CCACHE_DIR="${CCACHE_DIR:-$HOME/.ccache}" CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}" \
  CCACHE_NOHASHDIR=1 CCACHE_EXTRAFILES="$ext/cpu_flags" .venv/bin/python3 -c "
from deepspeed.ops.op_builder.cpu import CPUAdamBuilder, ShareMemCommBuilder
for b in (CPUAdamBuilder(), ShareMemCommBuilder()):
    b.load(verbose=False)" >"$ext/install.log" 2>&1 ||
  echo "dscpp install: warning: DeepSpeed's CPU ops did not build" \
    "(build/torch_extensions/install.log); the tests that load them will try again"
echo "dscpp install: done"
