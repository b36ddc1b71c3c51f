# The launcher's hostfile reader (NUL and control bytes, sizes).
dscpp_add_fuzzer(hostfile
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_hostfile.cpp ${PROJECT_SOURCE_DIR}/launcher/hostfile.cpp
  LINK fmt::fmt-header-only)
target_include_directories(fuzz_hostfile PRIVATE ${PROJECT_SOURCE_DIR}/launcher)
