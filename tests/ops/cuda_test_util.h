// What the CUDA kernel tests share: buffers poisoned with NaN
// around (and under) the arrays a kernel writes, so an element it leaves unwritten shows.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/full.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "tests/gpu_skip.h"

namespace dscpp::ops::test {

// A CUDA tensor of `sizes` and dtype, starting `offset` elements into a NaN-filled buffer (an
// offset moves it off a 16-byte boundary and so onto the kernels' unaligned paths).
inline at::Tensor poisoned(at::IntArrayRef sizes, at::ScalarType dtype, int64_t offset = 0) {
  int64_t numel = 1;
  for (const int64_t s : sizes) numel *= s;
  const at::Tensor buf =
      at::full({numel + offset + 8}, NAN, at::TensorOptions().dtype(dtype).device(at::kCUDA));
  return buf.narrow(0, offset, numel).view(sizes);
}

// A CUDA copy of cpu placed as poisoned() places it.
inline at::Tensor placed(const at::Tensor& cpu, int64_t offset = 0) {
  at::Tensor t = poisoned(cpu.sizes(), cpu.scalar_type(), offset);
  t.copy_(cpu);
  return t;
}

// Fills the CUDA caching allocator's free blocks of about `bytes` with NaN, so that tensors the
// op allocates next (it allocates its outputs itself) likely start as NaN, not as zeros left
// by earlier work.
inline void poison_allocator(int64_t bytes) {
  at::full({bytes / 4 + 1}, NAN, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
}

inline cudaStream_t current_stream() {
  return c10::cuda::getCurrentCUDAStream().stream();
}

inline bool has_nan(const at::Tensor& t) {
  return t.isnan().any().item<bool>();
}

}  // namespace dscpp::ops::test
