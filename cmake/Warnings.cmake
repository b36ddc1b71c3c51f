# Warnings are errors in our own code (not in LibTorch's headers, included as SYSTEM).
# DSCPP_WERROR=OFF keeps them warnings (a GPU build whose g++ warns where clang++ here does not
# should still build: scripts/gpu_rows.py --no-werror).
option(DSCPP_WERROR "Treat warnings in dscpp's code as errors" ON)
add_library(dscpp_warnings INTERFACE)
target_compile_options(dscpp_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra $<$<BOOL:${DSCPP_WERROR}>:-Werror>>)
