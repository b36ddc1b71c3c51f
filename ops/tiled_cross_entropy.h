// The mean cross entropy of the logits x · Wᵀ against targets, computed tile by tile over the
// rows so that no more than one tile's logits ever exist (DeepSpeed ALST's
// TiledFusedLogitsLoss): at a long sequence the whole logits are the largest tensor of a step
// (128 K tokens of a 50 K vocabulary: 12.8 GB in bf16, twice that in fp32 for the softmax).
// Forward keeps x, W and the targets; backward computes each tile's logits again and its
// gradients of x and W from them. Each tile's logits are formed in x's dtype, as the untiled
// head forms them, and its softmax in fp32; targets of ignore_index are left out; the mean is
// over the counted targets of all tiles (NaN when none counts, as PyTorch's).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dscpp::ops {

// x: [N, h]; weight: [V, h]; targets: [N] int64; tiles >= 1 (at most N of them). Returns a 0-d
// fp32 tensor (fp64 for fp64 x). Throws dscpp::Error for mismatched shapes or tiles < 1.
at::Tensor tiled_cross_entropy(const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& targets, int64_t tiles,
                               int64_t ignore_index = -100);

}  // namespace dscpp::ops
