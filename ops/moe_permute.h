// The MoE token permutation around the local experts' grouped GEMM (Megatron-Core's
// permute / unpermute): the kept routes of a routing gathered expert-major, and the experts'
// outputs weighed and summed back into their tokens. Both are differentiable.
//
// A routing of S tokens is indices int64 [S, k] (the experts chosen) and kept bool [S, k] (the
// route survived the capacity; the router decided); route j of token s is the flat route
// s * k + j. The permuted rows are the kept routes sorted by expert, stably (within an
// expert, by flat route: token order, then choice), so every path gives the same order.
//
// Which path runs: CUDA kernels (DSCPP_CUDA build, tokens on a CUDA device, bf16, fp16 or fp32,
// at most kMoePermuteMaxExperts experts) or an ATen composition everywhere else (the CPU path
// and the kernels' oracle). The kernels never wait on the host: a histogram of the kept routes'
// experts, an exclusive scan, each route's destination row, then one gather of the rows. As
// the number of kept routes is then known only on the device, the kernel path returns S * k
// rows (the most there can be): the kept routes' rows first, then zero padding rows. The ATen
// path reads the kept routes on the host (nonzero) and returns exactly their rows.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dscpp::ops {

// The experts the permutation kernels take (their per-block histograms live in shared memory).
inline constexpr int64_t kMoePermuteMaxExperts = 1024;

struct MoePermutation {
  // [N, H] in tokens' dtype, differentiable: rows [0, sum(counts)) are the kept routes'
  // tokens expert-major; N = sum(counts) on the ATen path, S * k on the kernel path, whose
  // rows past sum(counts) are zero padding (a grouped GEMM given counts ignores them).
  at::Tensor rows;
  at::Tensor counts;      // int64 [E] kept routes per expert, on tokens' device
  at::Tensor row_route;   // int64 [N]: the flat route of each row, -1 for a padding row
  at::Tensor route_dest;  // int64 [S * k]: the row of each route, -1 for a dropped one
  bool padded = false;    // rows may hold padding (the kernel path)
};

// tokens [S, H]; indices, kept [S, k] on tokens' device; num_experts >= 1. A kept route's
// expert must lie in [0, num_experts): the ATen path throws otherwise; the kernels (which
// check nothing on the host) leave such a route out, as if dropped. allow_kernels false forces
// the ATen path (the benchmark's and the tests' comparison).
MoePermutation moe_permute(const at::Tensor& tokens, const at::Tensor& indices,
                           const at::Tensor& kept, int64_t num_experts, bool allow_kernels = true);

// The fixed layout of a capacity C (DeepSpeed's [E, C, H] dispatch buffer, for a fixed-size
// exchange): rows [E * C, H], expert e's in [e*C, (e+1)*C): its kept routes in the order above,
// then zero rows (row_route -1). padded is true, counts the kept routes per expert. Made on the
// device by a stable sort, a scan and a gather: nothing is read on the host, on any device. The
// router keeps at most C routes per expert; a kept route past C, or one whose expert lies
// outside [0, num_experts), is left out as if dropped (what the kernels do with the latter).
MoePermutation moe_permute_padded(const at::Tensor& tokens, const at::Tensor& indices,
                                  const at::Tensor& kept, int64_t num_experts, int64_t capacity);

// out[s] = sum over the kept routes j of token s of weights[s, j] * expert_rows[row of (s, j)],
// accumulated in fp32, in expert_rows' dtype: [S, H']. expert_rows [N', H'] are the experts'
// outputs in the permuted order, sum(counts) <= N' <= N (rows past sum(counts) are ignored, so
// they may hold anything, NaN included); weights fp32 [S, k], differentiable (the router's
// combine weights). Backward: d expert_rows[r] = weights[route] * grad[token] (zero for
// padding rows), d weights[s, j] = <grad[s], expert_rows[row]> in fp32 (zero where dropped).
// The kernel path runs where the permutation's did and expert_rows is bf16, fp16 or fp32.
at::Tensor moe_unpermute(const at::Tensor& expert_rows, const at::Tensor& weights,
                         const MoePermutation& permutation, bool allow_kernels = true);

// Whether moe_permute takes the kernels for these tokens and this many experts.
bool moe_permute_uses_kernels(const at::Tensor& tokens, int64_t num_experts);

}  // namespace dscpp::ops
