// Internal to runtime/checkpoint: what the torch file writer and reader share: the
// torch.*Storage names of each dtype, and error text without LibTorch's backtraces.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <stdexcept>
#include <string>

#include "dscpp/comm/error_text.h"
#include "dscpp/error.h"

namespace dscpp::checkpoint::detail {

struct StorageName {
  at::ScalarType dtype;
  const char* name;
};
inline constexpr StorageName kStorageNames[] = {
    {at::kFloat, "FloatStorage"},
    {at::kDouble, "DoubleStorage"},
    {at::kHalf, "HalfStorage"},
    {at::kBFloat16, "BFloat16Storage"},
    {at::kLong, "LongStorage"},
    {at::kInt, "IntStorage"},
    {at::kShort, "ShortStorage"},
    {at::kChar, "CharStorage"},
    {at::kByte, "ByteStorage"},
    {at::kBool, "BoolStorage"},
    {at::kComplexFloat, "ComplexFloatStorage"},
    {at::kComplexDouble, "ComplexDoubleStorage"},
};

inline const char* storage_name(at::ScalarType t) {
  for (const auto& s : kStorageNames) {
    if (s.dtype == t) return s.name;
  }
  throw dscpp::Error(std::string("cannot save a tensor of dtype ") + c10::toString(t));
}

inline bool storage_dtype(const std::string& name, at::ScalarType* out) {
  for (const auto& s : kStorageNames) {
    if (name == s.name) {
      *out = s.dtype;
      return true;
    }
  }
  if (name == "UntypedStorage") {
    *out = at::kByte;
    return true;
  }
  return false;
}

using comm::error_text;

}  // namespace dscpp::checkpoint::detail
