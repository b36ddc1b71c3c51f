// RMSNorm, make_norm and rotary position embedding.
#include "dscpp/model_zoo/gpt_blocks.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/outer.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/rms_norm.h>
#include <torch/nn/modules/normalization.h>

namespace dscpp::model_zoo {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor RMSNormImpl::forward(const at::Tensor& x) {
  return at::rms_norm(x, {weight.size(0)}, weight, eps);
}

std::shared_ptr<torch::nn::Module> make_norm(const GPTConfig& c) {
  if (c.normalization == "RMSNorm")
    return std::make_shared<RMSNormImpl>(c.hidden_size, c.layernorm_epsilon);
  // LibTorch's LayerNorm starts at weight 1, bias 0, as GPT-2 and Megatron do.
  return std::make_shared<torch::nn::LayerNormImpl>(
      torch::nn::LayerNormOptions({c.hidden_size}).eps(c.layernorm_epsilon));
}

at::Tensor apply_norm(torch::nn::Module& norm, const at::Tensor& x) {
  if (auto* rms = dynamic_cast<RMSNormImpl*>(&norm)) return rms->forward(x);
  return static_cast<torch::nn::LayerNormImpl&>(norm).forward(x);
}

at::Tensor apply_rotary(const at::Tensor& x, int64_t rotary_dim, double rotary_base) {
  const int64_t seq = x.size(2), d = x.size(3), half = rotary_dim / 2;
  const auto f32 = x.options().dtype(at::kFloat);
  const at::Tensor inv_freq =
      at::pow(rotary_base, at::arange(0, rotary_dim, 2, f32) / static_cast<double>(rotary_dim))
          .reciprocal();
  at::Tensor angles = at::outer(at::arange(seq, f32), inv_freq);  // [S, rotary_dim / 2]
  angles = at::cat({angles, angles}, -1);                         // [S, rotary_dim]
  const at::Tensor cos = angles.cos().to(x.scalar_type()), sin = angles.sin().to(x.scalar_type());
  const at::Tensor r = x.narrow(-1, 0, rotary_dim);
  const at::Tensor rotated = at::cat({-r.narrow(-1, half, half), r.narrow(-1, 0, half)}, -1);
  at::Tensor y = r * cos + rotated * sin;
  if (rotary_dim == d) return y;
  return at::cat({y, x.narrow(-1, rotary_dim, d - rotary_dim)}, -1);
}

}  // namespace dscpp::model_zoo
