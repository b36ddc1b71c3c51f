// Delayed scaling's state and its step (fp8_meta.h).
#include "dscpp/nn/fp8_meta.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <string>
#include <vector>

#include "dscpp/ops/fp8.h"

namespace dscpp::nn {

namespace fp8 = ops::fp8;

Fp8MetaImpl::Fp8MetaImpl(int64_t products, const Fp8Recipe& recipe) : recipe_(recipe) {
  if (recipe.scaling != Fp8Scaling::Delayed)
    throw fp8::Fp8Error(
        "Fp8Meta: the amax history is the delayed recipe's; this recipe scales from each "
        "tensor's own amax (tensorwise or rowwise) and keeps no state");
  if (products < 1 || recipe.amax_history_len < 1)
    throw fp8::Fp8Error(
        "Fp8Meta: expected at least one product and a history of at least one "
        "step, found " +
        std::to_string(products) + " products and a history of " +
        std::to_string(recipe.amax_history_len));
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  amax_history =
      register_buffer("amax_history", at::zeros({recipe.amax_history_len, 3 * products}, f32));
  scale = register_buffer("scale", at::ones({3 * products}, f32));
}

void Fp8MetaImpl::to(torch::Device device, torch::Dtype, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
}

void Fp8MetaImpl::to(torch::Dtype, bool) {}

void Fp8MetaImpl::to(torch::Device device, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
}

void Fp8MetaImpl::update(const at::Tensor& reduced_row0) {
  at::NoGradGuard no_grad;
  const int64_t n = scale.size(0);
  at::Tensor history = amax_history.clone();
  history[0].copy_(reduced_row0);
  const at::Tensor amax =
      recipe_.amax_compute_algo == Fp8AmaxAlgo::Max ? std::get<0>(history.max(0)) : history[0];
  // The output gradient's columns (3 · slot + 2) take e5m2 under the hybrid format.
  const at::Tensor grad_column = at::arange(n, scale.options().dtype(at::kLong)).remainder(3) == 2;
  const at::Tensor e4m3 = fp8::factor_from_amax(amax, fp8::Format::E4M3, recipe_.margin);
  const at::Tensor factor =
      recipe_.hybrid
          ? at::where(grad_column, fp8::factor_from_amax(amax, fp8::Format::E5M2, recipe_.margin),
                      e4m3)
          : e4m3;
  scale.copy_(at::where(at::isfinite(amax) & (amax > 0), factor, scale));
  // Rolled: the oldest row (1) drops out, the newest (0) goes last, row 0 starts over.
  const int64_t len = history.size(0);
  amax_history.zero_();
  if (len > 1) {
    amax_history.narrow(0, 1, len - 2).copy_(history.narrow(0, 2, len - 2));
    amax_history[len - 1].copy_(history[0]);
  }
}

int64_t fp8_products_of(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters(/*recurse=*/true)) n += p.dim() == 2;
  return n;
}

void record_fp8_amax(const at::Tensor& history, int64_t slot, Fp8Operand operand,
                     const at::Tensor& amax) {
  at::NoGradGuard no_grad;
  at::Tensor cell = history.select(0, 0).narrow(0, 3 * slot + static_cast<int64_t>(operand), 1);
  cell.copy_(at::maximum(cell, amax.reshape({1}).to(cell.device())));
}

void update_fp8_metas(torch::nn::Module& module,
                      const std::function<void(at::Tensor&)>& reduce_max) {
  std::vector<Fp8MetaImpl*> metas;
  for (const auto& m : module.modules(/*include_self=*/false))
    if (auto* meta = dynamic_cast<Fp8MetaImpl*>(m.get())) metas.push_back(meta);
  if (metas.empty()) return;
  at::NoGradGuard no_grad;
  // One reduction for all of them: every meta's row 0, side by side.
  std::vector<at::Tensor> rows;
  for (auto* meta : metas) rows.push_back(meta->amax_history[0]);
  at::Tensor all = at::cat(rows);
  if (reduce_max) reduce_max(all);
  int64_t offset = 0;
  for (auto* meta : metas) {
    const int64_t n = meta->scale.size(0);
    meta->update(all.narrow(0, offset, n));
    offset += n;
  }
}

}  // namespace dscpp::nn
