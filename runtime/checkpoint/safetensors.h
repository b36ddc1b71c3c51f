// Hugging Face's safetensors format: an 8-byte little-endian header length N, N bytes of JSON
// ({"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {str: str}}, padded with spaces to a multiple of 8), then the raw
// little-endian bytes, offsets counted from the end of the header. What Python's
// safetensors.torch.save_file writes and load_file reads.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dscpp::checkpoint {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct Safetensors {
  NamedTensors tensors;  // in the order of their bytes in the file
  std::map<std::string, std::string> metadata;
};

// Writes the tensors (on the CPU, contiguous, in the given order) atomically: path + ".tmp",
// then a rename. dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL. Throws
// CheckpointError naming the file or the tensor.
void save_safetensors(const NamedTensors& tensors, const std::string& path,
                      const std::map<std::string, std::string>& metadata = {});

// Reads a whole file. Throws CheckpointError naming the file and what is wrong (a header
// longer than the file, JSON that is not the format, an unknown dtype, offsets outside the
// data or not matching the shape, overlapping tensors).
Safetensors load_safetensors(const std::string& path);
// The same over bytes in memory (`name` names them in errors): what tests/fuzz fuzzes.
Safetensors safetensors_from_memory(std::string_view bytes, const std::string& name);

}  // namespace dscpp::checkpoint
