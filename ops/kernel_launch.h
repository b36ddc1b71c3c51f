// The plain interface between the host wrappers (bias_gelu.cpp, cross_entropy.cpp: C++ with
// LibTorch) and the kernels (*.cu, nvcc, no ATen): pointers, sizes, a dtype tag. Every launch
// runs on the given stream of the current device and throws std::runtime_error naming the
// failing CUDA call; none synchronises the host. Pointers are to contiguous arrays.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace dscpp::ops::cuda {

enum class DType { kFloat32, kFloat16, kBFloat16 };  // the element type of the 16/32-bit arrays

// y[r, j] = gelu(x[r, j] + bias[j]) for r < rows, j < n; x, bias, y of dtype.
void launch_bias_gelu_forward(const void* x, const void* bias, void* y, int64_t rows, int64_t n,
                              DType dtype, bool tanh_approximation, cudaStream_t stream);

// How many fp32 partial sums per bias element the backward's dbias takes: its workspace holds
// bias_gelu_partial_rows(rows, n, dtype) * n floats.
int64_t bias_gelu_partial_rows(int64_t rows, int64_t n, DType dtype);

// dx[r, j] = grad[r, j] * gelu'(x[r, j] + bias[j]) (dx null: not written);
// dbias[j] = sum over r of that product, in fp32, rounded once to dtype (dbias null: not
// computed, workspace unused). workspace: fp32, bias_gelu_partial_rows(rows, n, dtype) * n.
void launch_bias_gelu_backward(const void* grad, const void* x, const void* bias, void* dx,
                               void* dbias, float* workspace, int64_t rows, int64_t n, DType dtype,
                               bool tanh_approximation, cudaStream_t stream);

// For each row r of logits [rows, vocab] (dtype) whose target is not ignore_index:
// lse[r] = logsumexp(logits[r]) and row_loss[r] = lse[r] - logits[r, target] (NaN for a target
// outside [0, vocab)); ignored rows get lse[r] = row_loss[r] = 0. Then, on device,
// count[0] = the number of counted rows and loss[0] = sum(row_loss) / count[0] (NaN for 0).
void launch_cross_entropy_forward(const void* logits, const int64_t* targets, int64_t rows,
                                  int64_t vocab, int64_t ignore_index, DType dtype, float* lse,
                                  float* row_loss, float* loss, float* count, cudaStream_t stream);

// dlogits[r, j] = (exp(logits[r, j] - lse[r]) - [j == target[r]]) * grad[0] / count[0] for
// counted rows, 0 for ignored ones; grad and count are device scalars (no host round trip).
void launch_cross_entropy_backward(const float* grad, const void* logits, const int64_t* targets,
                                   const float* lse, const float* count, int64_t rows,
                                   int64_t vocab, int64_t ignore_index, DType dtype, void* dlogits,
                                   cudaStream_t stream);

// Residual add + LayerNorm over rows of n: h = x + branch (rounded to dtype), then
// y = (h - mean) * rstd * weight + bias with mean and rstd = 1 / sqrt(var + eps) of the row of
// h (biased variance, fp32), written to mean[r] and rstd[r]. x, branch, h, y: [rows, n];
// weight, bias: [n]; all of dtype.
void launch_add_layer_norm_forward(const void* x, const void* branch, const void* weight,
                                   const void* bias, void* h, void* y, float* mean, float* rstd,
                                   int64_t rows, int64_t n, float eps, DType dtype,
                                   cudaStream_t stream);

// The widest row the backward kernels take (a row's elements live in the registers of one
// block of at most 1024 threads); wider rows take ATen's kernels (add_layer_norm.cpp).
inline constexpr int64_t kAddLayerNormBackwardMaxN = 8192;

// The backward's fp32 workspace in floats for rows of n on the current device: one row of
// 2 * n partial sums per block (the grid depends on n and the device's SM count).
int64_t add_layer_norm_backward_workspace(int64_t rows, int64_t n);

// From forward's h, mean, rstd: dx = dh + d LayerNorm / dh applied to dy (dh null: zero);
// dweight = sum over rows of dy * xhat, dbias = sum of dy, fp32 sums rounded once to dtype
// (either null: not written). dy, dh, h, dx: [rows, n]; weight, dweight, dbias: [n];
// workspace: add_layer_norm_backward_workspace(rows, n) floats. Throws for
// n > kAddLayerNormBackwardMaxN.
void launch_add_layer_norm_backward(const void* dy, const void* dh, const void* h,
                                    const void* weight, const float* mean, const float* rstd,
                                    void* dx, void* dweight, void* dbias, float* workspace,
                                    int64_t rows, int64_t n, DType dtype, cudaStream_t stream);

// The vocabulary-parallel cross entropy on this rank's shard logits [rows, part] (dtype), whose
// columns are the vocabulary's [start, start + part). row_max[r]: the shard row's max.
void launch_vocab_parallel_max(const void* logits, int64_t rows, int64_t part, DType dtype,
                               float* row_max, cudaStream_t stream);

// Given the group's row_max: sums[r] = sum_j exp(logits[r, j] - row_max[r]) and
// sums[rows + r] = logits[r, target[r] - start] - row_max[r] where this shard holds target[r],
// else 0 (so one SUM over the group of the 2 x rows values gives both totals).
void launch_vocab_parallel_sum_exp(const void* logits, const int64_t* targets, int64_t rows,
                                   int64_t part, int64_t start, const float* row_max, DType dtype,
                                   float* sums, cudaStream_t stream);

// dlogits[r, j] = (exp(logits[r, j] - row_max[r]) / sum_exp[r] - [start + j == target[r]]) *
// grad[r], with the group's row_max and sum_exp; grad: fp32 [rows].
void launch_vocab_parallel_backward(const float* grad, const void* logits, const int64_t* targets,
                                    int64_t rows, int64_t part, int64_t start, const float* row_max,
                                    const float* sum_exp, DType dtype, void* dlogits,
                                    cudaStream_t stream);

// SwiGLU over rows of 2f (fused_ops.h): y[r, j] = silu(x[r, j]) * x[r, f + j], x [rows, 2f],
// y [rows, f], fp32 arithmetic, one rounding.
void launch_swiglu_forward(const void* x, void* y, int64_t rows, int64_t f, DType dtype,
                           cudaStream_t stream);

// Its backward: dx[r, j] = dy[r, j] * x[r, f + j] * silu'(x[r, j]) and
// dx[r, f + j] = dy[r, j] * silu(x[r, j]); dy [rows, f], dx [rows, 2f].
void launch_swiglu_backward(const void* dy, const void* x, void* dx, int64_t rows, int64_t f,
                            DType dtype, cudaStream_t stream);

// The MoE router's top-k (moe_router.h) over scores [tokens, experts] fp32 plus bias [experts]
// (null: none): indices [tokens, k], weights [tokens, k] (scale x the chosen scores, divided by
// max(their sum, FLT_EPSILON) when normalize) and counts[e] += the routes of e (the caller
// zeroes counts). 1 <= k <= min(32, experts), experts <= 1024.
void launch_moe_topk_forward(const float* scores, const float* bias, int64_t tokens,
                             int64_t experts, int64_t k, bool normalize, float scale,
                             int64_t* indices, float* weights, int64_t* counts,
                             cudaStream_t stream);

// Its backward: d_scores [tokens, experts] from grad [tokens, k] of the weights (every element
// written: zero for the experts not chosen).
void launch_moe_topk_backward(const float* grad, const float* scores, const int64_t* indices,
                              int64_t tokens, int64_t experts, int64_t k, bool normalize,
                              float scale, float* d_scores, cudaStream_t stream);

// MoE permutation (moe_permute.h). routes = S * k flat routes; route r's expert is
// indices[r] when kept[r] and indices[r] in [0, experts), else it is not routed. Writes
// counts[e] (kept routes per expert), route_dest[r] (its row: experts in order, within one by
// r; -1 when not routed) and row_route[route_dest[r]] = r; row_route's other entries are left
// as they are (the caller fills it with -1 first). experts <= 1024; routes < 2^31.
// workspace: moe_permute_workspace(routes, experts) ints.
int64_t moe_permute_workspace(int64_t routes, int64_t experts);
void launch_moe_permute_routes(const int64_t* indices, const bool* kept, int64_t routes,
                               int64_t experts, int* workspace, int64_t* counts,
                               int64_t* route_dest, int64_t* row_route, cudaStream_t stream);

// out[r] = tokens[row_route[r] / k] for r < rows (zero where row_route[r] < 0); rows of hidden
// elements of element_size bytes (a plain copy: any dtype).
void launch_moe_gather_rows(const void* tokens, const int64_t* row_route, int64_t rows,
                            int64_t hidden, int64_t k, int64_t element_size, void* out,
                            cudaStream_t stream);

// out[s] = sum over j < k with 0 <= d = route_dest[s * k + j] < in_rows of
// weights[s * k + j] * in[d] (weights null: 1), fp32 sums rounded once to dtype. in [in_rows,
// hidden], out [tokens, hidden]. The unpermute's forward and the permute's backward.
void launch_moe_combine(const void* in, const float* weights, const int64_t* route_dest,
                        int64_t in_rows, int64_t tokens, int64_t hidden, int64_t k, DType dtype,
                        void* out, cudaStream_t stream);

// The unpermute's backward for rows r < rows of expert_rows [rows, hidden]: with
// route = row_route[r] >= 0 and token = route / k, d_rows[r] = weights[route] * grad[token]
// and d_weights[route] = <grad[token], expert_rows[r]> (fp32; d_weights null: not computed);
// d_rows[r] = 0 where route < 0. grad [tokens, hidden]; d_weights' other entries are left as
// they are (the caller zeroes it first).
void launch_moe_unpermute_backward(const void* grad, const void* expert_rows, const float* weights,
                                   const int64_t* row_route, int64_t rows, int64_t hidden,
                                   int64_t k, DType dtype, void* d_rows, float* d_weights,
                                   cudaStream_t stream);

// The FP8 cast (ops/fp8.h for the formulas) of x [rows, cols] (dtype), in one pass: each
// element becomes fp8(clamp(x · q, ±max)) with the quantising factor
// q = float(max / (max(amax, 1e-12) · 2^margin)), rounded down to a power of two with
// power_of_2; max is e4m3's 448 or e5m2's 57344, NaN stays NaN, the rounding is to nearest even.
// amax (fp32) holds one value (scale_axis 0), one per row (1) or one per column (2); with
// factor_given it holds the factors q themselves (delayed scaling's, kept between steps; margin
// and power_of_2 then unused). scale_out (fp32, as many) gets 1 / q, the dequantising scale.
// out: [rows, cols] row-major, out_t: the transpose [cols, rows] row-major; either may be null.
enum class Fp8Kind { kE4M3, kE5M2 };
void launch_fp8_cast(const void* x, const float* amax, bool factor_given, int64_t rows,
                     int64_t cols, DType dtype, int scale_axis, Fp8Kind kind, int margin,
                     bool power_of_2, void* out, void* out_t, float* scale_out,
                     cudaStream_t stream);

// The absolute maximum of x's n elements (dtype) into *amax (fp32; it is zeroed first, on the
// stream): a NaN anywhere gives NaN, an infinity infinity, as the infinity norm does.
void launch_fp8_amax(const void* x, int64_t n, DType dtype, float* amax, cudaStream_t stream);

}  // namespace dscpp::ops::cuda
