// libFuzzer harness of the safetensors reader (runtime/checkpoint/safetensors.h): any bytes
// either read as tensors that lie inside them, or give a CheckpointError; any other exception,
// a crash or a sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dscpp/runtime/checkpoint/checkpoint_error.h"
#include "dscpp/runtime/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto st = dscpp::checkpoint::safetensors_from_memory(
        std::string_view(reinterpret_cast<const char*>(data), size), "input");
    size_t bytes = 0;
    for (const auto& [name, t] : st.tensors) bytes += t.numel() * t.element_size();
    if (bytes > size) __builtin_trap();  // the tensors' bytes come from the input
  } catch (const dscpp::checkpoint::CheckpointError&) {
  }
  return 0;
}
