// libFuzzer harness of the unpickler (runtime/checkpoint/unpickler.h): any data.pkl bytes give
// a PyValue or a CheckpointError; any other exception, a crash (a stack overflow while building
// or destroying a deep value), a leak (a memo cycle) or a sanitizer report is a bug. Storages
// read as zeros, as small as the pickle asks (at most 64 Ki elements).
#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "dscpp/runtime/checkpoint/checkpoint_error.h"
#include "dscpp/runtime/checkpoint/unpickler.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string pkl(reinterpret_cast<const char*>(data), size);
  try {
    dscpp::checkpoint::PyValue v = dscpp::checkpoint::detail::unpickle(
        pkl, [](const std::string& key, at::ScalarType dtype, int64_t numel) {
          if (numel > (int64_t{1} << 16))
            throw dscpp::checkpoint::CheckpointError("storage " + key + " too large to fuzz");
          return at::zeros({numel}, at::TensorOptions().dtype(dtype));
        });
    (void)v.kind_name();
  } catch (const dscpp::checkpoint::CheckpointError&) {
  }
  return 0;
}
