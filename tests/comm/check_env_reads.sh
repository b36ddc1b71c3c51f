#!/usr/bin/env bash
# The library reads no environment variable but the launch contract, and reads
# those in one place, comm/launch_env.cpp. Fails listing any other getenv/environ in the
# library's folders (tools/, examples/, bench/, launcher/ and tests/ are programs, not library).
cd "$(dirname "$0")/../.." || exit 2
hits=$(grep -rnE '\bgetenv\b|secure_getenv|[^_a-z]environ\b' \
         --include='*.cpp' --include='*.h' --include='*.cu' --include='*.cuh' \
         config comm data ops nn optim model_zoo zero runtime error.h dscpp.h |
       grep -v '^comm/launch_env\.cpp:' | grep -v '^comm/launch_env\.h:')
if [ -n "$hits" ]; then
  echo "environment read outside comm/launch_env.cpp:"
  echo "$hits"
  exit 1
fi
echo "PASS: the library reads the environment only in comm/launch_env.cpp"
