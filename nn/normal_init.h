// normal_init: fills a tensor with normal(0, std) samples, on the CPU in parallel; and the
// expert-major variants that fill each expert of a stacked MoE weight by its global expert id.
//
// A 13 B model has 13 billion weights to draw; LibTorch's CPU normal_ draws them from one
// generator, serially (about 7 ns each: minutes). Here a CPU tensor is cut into fixed blocks
// of 2^20 elements, each filled by its own generator seeded from one 64-bit draw of the
// default CPU generator (so at::manual_seed still decides everything) and the block's index.
// The values depend on the seed and the tensor's size only, not on the thread count; they are
// not the values a single at::normal_ would give. A CUDA tensor uses its device's normal_.
//
// Experts (nn/moe): an expert-parallel rank holds E_l of a layer's E experts, stacked on dim 0
// ([E_l, ...], local expert j = global expert first_expert + j). Drawing that tensor with
// normal_init would make its values depend on E_l (and every expert-parallel rank would draw
// the same local experts). normal_init_experts / uniform_init_experts instead fill each
// expert's slice from its own stream, keyed by the one 64-bit draw and the GLOBAL expert id
// (then blocked as above), so expert g holds the same values at every expert-parallel degree,
// and the default generator advances by exactly one draw whatever E_l is, so what is built
// after the layer does not depend on the degree either. Any device and layout: a tensor that is
// not a contiguous CPU tensor is filled through a CPU copy.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dscpp::nn {

void normal_init(const at::Tensor& tensor, double std);

// stacked [E_l, ...]: expert j ~ normal(0, std) from global expert first_expert + j's stream.
void normal_init_experts(const at::Tensor& stacked, double std, int64_t first_expert);
// stacked [E_l, ...]: expert j ~ U(-bound, bound) from global expert first_expert + j's stream
// (nn.Linear's default with bound 1/sqrt(fan_in)).
void uniform_init_experts(const at::Tensor& stacked, double bound, int64_t first_expert);

}  // namespace dscpp::nn
