// The GPT's interchangeable block parts (GPTConfig's normalization and position_embedding_type):
// RMSNorm, the norm a config names, and rotary position embedding as Megatron-LM applies it.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <memory>

#include "dscpp/model_zoo/gpt_config.h"

namespace dscpp::model_zoo {

// y = x * rsqrt(mean(x^2 over the last dim) + eps) * weight; "weight" [dim] starts at one.
struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);
  at::Tensor weight;
  double eps = 1e-5;
};
TORCH_MODULE(RMSNorm);

// config.normalization over hidden_size: torch::nn::LayerNorm ("weight", "bias") or RMSNorm
// ("weight"), each at layernorm_epsilon.
std::shared_ptr<torch::nn::Module> make_norm(const GPTConfig& config);
// Runs a module that make_norm built.
at::Tensor apply_norm(torch::nn::Module& norm, const at::Tensor& x);

// Megatron's rotary embedding, rotate-half (non-interleaved) form, on x [B, heads, S, d]:
// the first rotary_dim channels r become r * cos + rotate_half(r) * sin, where
// rotate_half([a, b]) = [-b, a] and the angle of position p, channel i (and i + rotary_dim/2)
// is p * rotary_base^(-2i / rotary_dim); the other channels pass. The angles are computed in
// fp32, their cos and sin rounded to x's dtype.
at::Tensor apply_rotary(const at::Tensor& x, int64_t rotary_dim, double rotary_base);

}  // namespace dscpp::model_zoo
