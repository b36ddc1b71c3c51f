#!/usr/bin/env bash
# Installs the build tree into a scratch prefix, then configures, builds and runs a tiny
# outside project that does find_package(dscpp) and links dscpp::dscpp.
set -euo pipefail
build_dir=$1
src_dir=$(cd "$(dirname "$0")" && pwd)/consumer
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cxx=$(grep -E '^CMAKE_CXX_COMPILER:' "$build_dir/CMakeCache.txt" | cut -d= -f2)
cmake -S "$src_dir" -B "$work/build" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log" 2>&1 || { cat "$work/configure.log"; exit 1; }
ninja -C "$work/build" >/dev/null
"$work/build/consumer" >"$work/out.txt" || { cat "$work/out.txt"; exit 1; }
grep -qx "micro_batch=4" "$work/out.txt" && grep -qx "trained=1" "$work/out.txt" || { cat "$work/out.txt"; exit 1; }
echo "outside project built against the installed package and ran"
