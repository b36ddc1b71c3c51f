#!/usr/bin/env bash
# Builds, on this CPU machine, the CUDA variant's executables that bench/rows.toml's rows run
# (scripts/gpu_rows.py), and packs them for the GPU machine, where the runner uses them instead
# of building when they were built from the same sources:
#   .gpu/prebuilt/bin.tar.xz       build-cuda/...: the executables, stripped, at their paths
#                                  under build-cuda/; lib/: the shared libraries they need that
#                                  the GPU machine lacks (Debian 12's yaml-cpp 0.7 and
#                                  protobuf-lite 32; LibTorch, CUDA and NCCL come from the GPU
#                                  machine's torch there)
#   .gpu/prebuilt/sources.sha256   the build's inputs (every tracked C++, CUDA and CMake file):
#                                  gpu_rows.py builds there (g++) if any of them changed
#   .gpu/commit                    the commit the tree was at (the GPU machine's copy of the
#                                  tree has no .git; gpu_rows.py prints it above its table)
# Why: a fresh GPU machine spends 140-165 s building these before it measures anything.
# Built here with clang++ in Release (-O3, the GPU build's type); the GPU build uses g++ 13.3:
# a figure taken with the prebuilt binaries says so.
# Usage: scripts/gpu_prebuild.sh   (build folder build-cuda-rel/, then the pack)
set -euo pipefail
cd "$(dirname "$0")/.."
# Every executable a row of bench/rows.toml runs (dscpp_report among them: the GPU machine runs
# it first, to see that the pack's executables start there).
read -r -a targets <<<"$("${DSCPP_PYTHON:-python3}" scripts/gpu_rows.py --targets)"
[ "${#targets[@]}" -gt 0 ] || { echo "gpu_prebuild: scripts/gpu_rows.py --targets named no target" >&2; exit 1; }
dir=build-cuda-rel
DSCPP_BUILD_DIR=$dir DSCPP_BUILD_TYPE=Release scripts/build.sh cuda "${targets[@]}"
pack=.gpu/prebuilt
rm -rf "$pack"
mkdir -p "$pack/lib"
for t in "${targets[@]}"; do
  # The target's file, as ninja names it (the phony target's one input).
  src=$dir/$(ninja -C "$dir" -t query "$t" | awk '/input: phony/ { getline; print $1; exit }')
  [ -x "$src" ] || { echo "gpu_prebuild: no executable for target $t ($src)" >&2; exit 1; }
  mkdir -p "$pack/build-cuda/$(dirname "${src#$dir/}")"
  strip -o "$pack/build-cuda/${src#$dir/}" "$src"
done
# The libraries outside LibTorch, CUDA and the C runtime that the GPU machine (Ubuntu 24.04) has
# in other versions or not at all; Boost.Program_options and liburing come from .gpu/*.deb.
for lib in libyaml-cpp.so.0.7 libprotobuf-lite.so.32; do
  cp -L "/lib/x86_64-linux-gnu/$lib" "$pack/lib/"
done
# xz: 39 MB of executables become ~6 MB of the 64 MiB a device call carries.
tar -C "$pack" -cf - build-cuda lib | xz -T0 -6 >"$pack/bin.tar.xz"
rm -rf "$pack/build-cuda" "$pack/lib"
git ls-files -z -- '*.cpp' '*.h' '*.cu' '*.cuh' '*.cmake' '*CMakeLists.txt' | xargs -0 sha256sum >"$pack/sources.sha256"
{ echo "built $(date -u +%FT%TZ) on $(hostname) from $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo '+changes')"
  echo "compiler: $(clang++ --version | head -n 1); build type Release; $(du -sh "$pack" | cut -f1)"; } >"$pack/BUILT"
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo ' with uncommitted changes')" >.gpu/commit
cat "$pack/BUILT"
