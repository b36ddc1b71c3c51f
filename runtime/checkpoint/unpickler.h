// The unpickler of a torch file's data.pkl (pickle protocols 2-5, the opcodes torch.save and
// DeepSpeed's checkpoints use; see load_torch_file in torch_file.h for what each Python value
// reads as). Bounded for input from outside: values at most kMaxDepth deep and kMaxValues in
// all; every error is a CheckpointError "data.pkl: <what> (near byte N)", and a refused pickle
// is destroyed without recursion. Internal to runtime/checkpoint (and its fuzzing harness).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "dscpp/runtime/checkpoint/torch_file.h"

namespace dscpp::checkpoint::detail {

// Python's own pickle refuses about 1000 levels; a DeepSpeed checkpoint holds fewer than 10.
inline constexpr int kMaxDepth = 1000;
// Values in all: a memo entry referenced twice at every level stands for 2^levels of them.
inline constexpr size_t kMaxValues = size_t{1} << 20;

// A storage's elements: a 1-D tensor of `numel` elements of `dtype` from record data/<key>.
// Called once per key.
using StorageLoader =
    std::function<at::Tensor(const std::string& key, at::ScalarType dtype, int64_t numel)>;

PyValue unpickle(const std::string& data, const StorageLoader& load);

}  // namespace dscpp::checkpoint::detail
