// DeepSpeed ALST's SequenceTiledCompute (its TiledMLP): y = fn(x, params) computed over `tiles`
// equal slices of x along `dim`, each slice's inner activations alive only while it runs. At a
// long sequence an MLP's inner activation ([B, S, ffn], four times the hidden states, and
// twice that for SwiGLU's gate and up) is the largest tensor of a block; tiled, one slice's is.
// Forward keeps x and the parameters; backward runs fn on each slice again and takes the
// gradients of the slice and of the parameters (autograd::grad on detached aliases of the
// parameters), summing the parameters' in fp32 over the slices, so that each parameter's
// accumulator (ZeRO's hooks) runs once with the whole gradient. fn must act on each slice
// alone (each output slice depends only on its input slice: an MLP over tokens), give its
// output x's size along dim, and run as it did in forward without outside state (no dropout,
// no FP8 scope). Not under the zero-bubble schedules' split backward (a dscpp::Error there).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace dscpp::nn {

using TiledFn =
    std::function<at::Tensor(const at::Tensor& x, const std::vector<at::Tensor>& params)>;

// tiles <= 1, or not more than x.size(dim): fn(x, params) as it is.
at::Tensor tiled_compute(const TiledFn& fn, const at::Tensor& x,
                         const std::vector<at::Tensor>& params, int64_t dim, int64_t tiles);

}  // namespace dscpp::nn
