// The forward and backward halves of each fused op, without autograd: fused_ops.cpp wires
// them into autograd Functions; bias_gelu.cpp and cross_entropy.cpp implement them, each
// choosing between its CUDA kernel and the ATen composition (see fused_ops.h for the contract).
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <utility>

namespace dscpp::ops::detail {

// gelu(x + bias). Throws c10::Error on shapes, devices or dtypes the op does not take.
at::Tensor bias_gelu_forward(const at::Tensor& x, const at::Tensor& bias, bool tanh_approximation);

// {dx, dbias} for the incoming grad; dx is undefined unless need_dx, dbias unless need_dbias.
std::pair<at::Tensor, at::Tensor> bias_gelu_backward(const at::Tensor& grad, const at::Tensor& x,
                                                     const at::Tensor& bias,
                                                     bool tanh_approximation, bool need_dx,
                                                     bool need_dbias);

struct CrossEntropyForward {
  at::Tensor loss;   // 0-d: the mean over counted rows (fp32; fp64 for fp64 logits)
  at::Tensor lse;    // [N] logsumexp of each row, in the loss's dtype (unspecified where ignored)
  at::Tensor count;  // 0-d, the loss's dtype: how many rows' targets are not ignore_index
};

CrossEntropyForward cross_entropy_forward(const at::Tensor& logits, const at::Tensor& targets,
                                          int64_t ignore_index);

// grad_logits for the incoming 0-d grad, in logits' dtype, from forward's lse and count.
at::Tensor cross_entropy_backward(const at::Tensor& grad, const at::Tensor& logits,
                                  const at::Tensor& targets, const at::Tensor& lse,
                                  const at::Tensor& count, int64_t ignore_index);

struct AddLayerNormForward {
  at::Tensor h;     // x + branch
  at::Tensor y;     // layer_norm(h)
  at::Tensor mean;  // of each row of h, fp32 (the ATen path: native_layer_norm's)
  at::Tensor rstd;  // 1 / sqrt(var + eps) of each row, likewise
};

AddLayerNormForward add_layer_norm_forward(const at::Tensor& x, const at::Tensor& branch,
                                           const at::Tensor& weight, const at::Tensor& bias,
                                           double eps);

// {dx, dweight, dbias} for the gradients of h (dh) and y (dy), either undefined (zero), from
// forward's h, mean and rstd. dx is the gradient of both x and branch. Each result is undefined
// unless asked for (need[0..2]) or when both incoming gradients are undefined.
std::array<at::Tensor, 3> add_layer_norm_backward(const at::Tensor& dh, const at::Tensor& dy,
                                                  const at::Tensor& h, const at::Tensor& weight,
                                                  const at::Tensor& bias, const at::Tensor& mean,
                                                  const at::Tensor& rstd, std::array<bool, 3> need);

// silu(x[..., :f]) * x[..., f:]; throws c10::Error for an odd last dimension.
at::Tensor swiglu_forward(const at::Tensor& x);
// dx [..., 2f] for the incoming grad [..., f] of swiglu(x).
at::Tensor swiglu_backward(const at::Tensor& grad, const at::Tensor& x);

}  // namespace dscpp::ops::detail
