// Which tensors the CUDA kernels take (CUDA build only): the DType tag of an ATen scalar type,
// none for the types that stay on the ATen path (float64, integers, ...).
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>

#include "dscpp/ops/kernel_launch.h"

namespace dscpp::ops::cuda {

inline std::optional<DType> kernel_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float:
      return DType::kFloat32;
    case c10::ScalarType::Half:
      return DType::kFloat16;
    case c10::ScalarType::BFloat16:
      return DType::kBFloat16;
    default:
      return std::nullopt;
  }
}

}  // namespace dscpp::ops::cuda
