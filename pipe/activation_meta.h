// What two neighbouring stages agree on before activations travel: the number of tensors of
// an activation and each one's shape, dtype and whether its gradient comes back. Sent once
// per batch on each link, as a fixed-size int64 tensor (so the receiver knows its size);
// buffers are made from it and kept while it stays the same (a new sequence length gets new
// ones).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "dscpp/nn/layer_spec.h"

namespace dscpp::pipe {

struct TensorMeta {
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
  bool requires_grad = false;  // its gradient travels back
  bool operator==(const TensorMeta& o) const {
    return shape == o.shape && dtype == o.dtype && requires_grad == o.requires_grad;
  }
};
using ActivationMeta = std::vector<TensorMeta>;

inline constexpr int64_t kMetaLength = 64;  // int64 elements of an encoded ActivationMeta

ActivationMeta meta_of(const nn::Activation& a);
// Throws dscpp::Error when the activation does not fit in kMetaLength (too many tensors or
// dimensions).
at::Tensor encode_meta(const ActivationMeta& meta, at::Device device);
ActivationMeta decode_meta(const at::Tensor& encoded);
// Empty tensors of the meta's shapes and dtypes (only the requires_grad ones when grads_only).
nn::Activation allocate(const ActivationMeta& meta, at::Device device, bool grads_only = false);

}  // namespace dscpp::pipe
