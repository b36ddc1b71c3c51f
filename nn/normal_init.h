// normal_init: fills a tensor with normal(0, std) samples, on the CPU in parallel.
//
// A 13 B model has 13 billion weights to draw; LibTorch's CPU normal_ draws them from one
// generator, serially (about 7 ns each: minutes). Here a CPU tensor is cut into fixed blocks
// of 2^20 elements, each filled by its own generator seeded from one 64-bit draw of the
// default CPU generator (so at::manual_seed still decides everything) and the block's index.
// The values depend on the seed and the tensor's size only, not on the thread count; they are
// not the values a single at::normal_ would give. A CUDA tensor uses its device's normal_.
#pragma once

#include <ATen/core/Tensor.h>

namespace dscpp::nn {

void normal_init(const at::Tensor& tensor, double std);

}  // namespace dscpp::nn
