# The unpickler of torch files' data.pkl (runtime/checkpoint/unpickler.h), on LibTorch's
# tensors (LibTorch itself is not instrumented).
dscpp_add_fuzzer(unpickle
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_unpickle.cpp
          ${PROJECT_SOURCE_DIR}/runtime/checkpoint/unpickler.cpp
          ${PROJECT_SOURCE_DIR}/runtime/checkpoint/py_value.cpp
  LAYERS runtime
  LINK dscpp_torch nlohmann_json::nlohmann_json)
