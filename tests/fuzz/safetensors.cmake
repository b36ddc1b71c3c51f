# The safetensors reader (runtime/checkpoint/safetensors.h), on LibTorch's tensors (LibTorch
# itself is not instrumented). Seed in corpus/safetensors/: a file Python's safetensors wrote
# (fp32, bf16, int64 and an empty tensor, with __metadata__).
dscpp_add_fuzzer(safetensors
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_safetensors.cpp
          ${PROJECT_SOURCE_DIR}/runtime/checkpoint/safetensors.cpp
          ${PROJECT_SOURCE_DIR}/runtime/checkpoint/atomic_file.cpp
  LAYERS runtime
  LINK dscpp_torch nlohmann_json::nlohmann_json fmt::fmt-header-only)
