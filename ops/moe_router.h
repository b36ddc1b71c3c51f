// The MoE router's top-k selection (nn/moe/router.h, Megatron's topk routing): from the
// scores of S tokens over E experts, each token's k experts by score plus the balancing bias,
// their combine weights from the unbiased scores, and the routes per expert. Differentiable in
// the scores (the caller's softmax or sigmoid of the logits stays in autograd).
//
//   selection = scores + bias (bias undefined: scores), never differentiated
//   indices[s] = the k experts of largest selection[s], in descending order
//   weights[s, j] = scale * scores[s, indices[s, j]] / max(sum_j scores[s, indices[s, j]], eps)
//                   (normalize; eps = FLT_EPSILON), or scale * scores[s, indices[s, j]]
//   counts[e] = the routes of expert e (no capacity: every route is kept)
//
// Which path runs: one CUDA kernel (a warp per token, the top k found by k warp-wide
// arg-maxes; among equal selection scores the lower expert comes first) and one for backward,
// when the build has CUDA, scores are fp32 on a CUDA device, E <= kMoeTopKMaxExperts and
// k <= kMoeTopKMaxK; ATen's topk, gather and sum otherwise (torch.topk's order among equal
// values). Neither waits on the host. Backward: d scores[s, indices[s, j]] =
// scale * (g_j - sum_i g_i w_i / scale) / T with T the chosen scores' sum (normalize, T >=
// eps), scale * g_j / eps below eps, scale * g_j without normalize; zero for other experts.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dscpp::ops {

inline constexpr int64_t kMoeTopKMaxExperts = 1024;  // a warp's scores live in shared memory
inline constexpr int64_t kMoeTopKMaxK = 32;          // one lane per chosen expert

struct MoeTopK {
  at::Tensor indices;  // int64 [S, k]
  at::Tensor weights;  // fp32 [S, k], differentiable in the scores
  at::Tensor counts;   // int64 [E] on the scores' device
};

// scores fp32 [S, E]; bias fp32 [E] or undefined; 1 <= k <= E. allow_kernels false forces the
// ATen path (the tests' comparison).
MoeTopK moe_topk_route(const at::Tensor& scores, const at::Tensor& bias, int64_t k, bool normalize,
                       double scale, bool allow_kernels = true);

// Whether moe_topk_route takes the kernels for these scores and this k.
bool moe_topk_route_uses_kernels(const at::Tensor& scores, int64_t k);

}  // namespace dscpp::ops
