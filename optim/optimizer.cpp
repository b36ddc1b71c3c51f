// Optimizer: what every algorithm on flat shards shares: its shards and their hyper-parameters
// (param groups), the step's gradient scale and type checks, the lr and momentum a schedule
// reads and writes. The update rules themselves are in optimizers.cpp.
#include <fmt/format.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/optim/optimizer.h"

namespace dscpp::optim {

int Optimizer::add_shard(at::Tensor param, const Hyper& overrides) {
  if (!param.defined() || param.dim() != 1 || param.scalar_type() != at::kFloat ||
      !param.is_contiguous())
    throw dscpp::Error(name() + ": a shard is a contiguous 1-D fp32 tensor");
  if (!overrides.is_object())
    throw dscpp::Error(name() + ": a shard's overrides are a JSON object");
  const int index = num_shards();
  Hyper merged = defaults_;
  for (const auto& [key, value] : overrides.items()) merged[key] = value;
  // A schedule's value set before this shard existed is every shard's, as it is for those that
  // existed then.
  if (scheduled_lr_) merged["lr"] = *scheduled_lr_;
  if (scheduled_momentum_) set_momentum_of(merged, *scheduled_momentum_);
  Shard s;
  s.param = std::move(param);
  s.hyper = resolve(merged, fmt::format("param_groups[{}]", index), /*strict=*/false);
  // State exists from registration on, so checkpoints can load into it and the ZeRO memory
  // claim holds before the first step.
  init_state(s);
  shards_.push_back(std::move(s));
  return index;
}

void Optimizer::step(const std::vector<at::Tensor>& grads, const at::Tensor& grad_scale) {
  if (grad_scale.defined() && !fuses_grad_scale())
    throw dscpp::Error(name() + ": this optimizer takes no grad_scale");
  if (grads.size() != shards_.size())
    throw dscpp::Error(
        fmt::format("{}: {} gradients for {} shards", name(), grads.size(), shards_.size()));
  for (size_t i = 0; i < grads.size(); ++i)
    if (!grads[i].defined() || grads[i].numel() != shards_[i].param.numel() ||
        !gradient_type(grads[i]))
      throw dscpp::Error(fmt::format(
          "{}: gradient {} is not an fp32, bf16 or fp16 tensor of the shard's size", name(), i));
  for (size_t i = 0; i < grads.size(); ++i) {
    Shard& s = shards_[i];
    if (s.state.empty() && s.steps == 0) init_state(s);
    ++s.steps;
    grad_scale_ = grad_scale.defined() ? &grad_scale : nullptr;
    update(s, as_read(grads[i].reshape({-1})));
    grad_scale_ = nullptr;
  }
}

bool Optimizer::gradient_type(const at::Tensor& grad) {
  const auto t = grad.scalar_type();
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

at::Tensor Optimizer::as_read(const at::Tensor& grad) const {
  return grad.scalar_type() == at::kFloat || reads_16bit_grads() ? grad : grad.to(at::kFloat);
}

void Optimizer::begin_step() {
  if (!elementwise()) throw dscpp::Error(name() + ": not elementwise, cannot step in ranges");
  for (Shard& s : shards_) {
    if (s.state.empty() && s.steps == 0) init_state(s);
    ++s.steps;
  }
}

void Optimizer::update_range(int shard, int64_t begin, int64_t end, const at::Tensor& grad,
                             const at::Tensor& grad_scale, const at::Tensor& param_copy) {
  Shard& s = shards_.at(shard);
  if (begin < 0 || end > s.param.numel() || begin > end || grad.numel() != end - begin ||
      !gradient_type(grad))
    throw dscpp::Error(
        fmt::format("{}: range [{}, {}) of shard {} ({} elements) with a gradient of {} elements",
                    name(), begin, end, shard, s.param.numel(), grad.numel()));
  // A shard of views: the update writes through them into the shard and its state.
  Shard part{s.param.slice(0, begin, end), s.hyper, {}, s.steps};
  for (auto& [key, t] : s.state) part.state[key] = t.slice(0, begin, end);
  update_part(part, grad, grad_scale, param_copy);
}

void Optimizer::update_detached(int shard, const at::Tensor& param,
                                const std::map<std::string, at::Tensor>& state,
                                const at::Tensor& grad, const at::Tensor& grad_scale,
                                const at::Tensor& param_copy) {
  const Shard& s = shards_.at(shard);
  if (!param.defined() || param.dim() != 1 || param.scalar_type() != at::kFloat ||
      grad.numel() != param.numel() || !gradient_type(grad))
    throw dscpp::Error(fmt::format("{}: a detached range of {} elements with a gradient of {}",
                                   name(), param.defined() ? param.numel() : 0, grad.numel()));
  Shard part{param, s.hyper, {}, s.steps};
  for (const auto& [key, t] : s.state) {
    auto it = state.find(key);
    if (it == state.end() || it->second.numel() != param.numel())
      throw dscpp::Error(fmt::format("{}: a detached range lacks its state '{}'", name(), key));
    part.state[key] = it->second;
  }
  update_part(part, grad, grad_scale, param_copy);
}

void Optimizer::update_part(Shard& part, const at::Tensor& grad, const at::Tensor& grad_scale,
                            const at::Tensor& param_copy) {
  if (grad_scale.defined() && !fuses_grad_scale())
    throw dscpp::Error(name() + ": this optimizer takes no grad_scale");
  const int64_t n = part.param.numel();
  if (param_copy.defined() && param_copy.numel() != n)
    throw dscpp::Error(fmt::format("{}: param_copy of {} elements for a range of {}", name(),
                                   param_copy.numel(), n));
  const bool writes = param_copy.defined() && writes_param_copy(param_copy);
  grad_scale_ = grad_scale.defined() ? &grad_scale : nullptr;
  param_copy_ = writes ? &param_copy : nullptr;
  update(part, as_read(grad.reshape({-1})));
  grad_scale_ = nullptr;
  param_copy_ = nullptr;
  if (param_copy.defined() && !writes) param_copy.copy_(part.param);
}

float Optimizer::grad_scale_value() const {
  return grad_scale_ ? grad_scale_->item<float>() : 1.0f;
}

// With no shard yet, the defaults are what a schedule reads and writes.
double Optimizer::get_lr(int shard) const {
  const Hyper& h = shards_.empty() ? defaults_ : shards_.at(shard).hyper;
  return h.at("lr").get<double>();
}

double Optimizer::lr_for(const Hyper& overrides) const {
  if (scheduled_lr_) return *scheduled_lr_;
  if (overrides.is_object() && overrides.contains("lr")) return overrides.at("lr").get<double>();
  return defaults_.at("lr").get<double>();
}

void Optimizer::set_lr(double lr) {
  scheduled_lr_ = lr;
  defaults_["lr"] = lr;
  for (Shard& s : shards_) s.hyper["lr"] = lr;
}

double Optimizer::get_momentum(int shard) const {
  const Hyper& h = shards_.empty() ? defaults_ : shards_.at(shard).hyper;
  if (h.contains("betas")) return h["betas"][0].get<double>();
  if (h.contains("momentum")) return h["momentum"].get<double>();
  return 0.0;  // Adagrad has no momentum
}

void Optimizer::set_momentum_of(Hyper& h, double momentum) {
  if (h.contains("betas"))
    h["betas"][0] = momentum;
  else if (h.contains("momentum"))
    h["momentum"] = momentum;
}

void Optimizer::set_momentum(double momentum) {
  scheduled_momentum_ = momentum;
  set_momentum_of(defaults_, momentum);
  for (Shard& s : shards_) set_momentum_of(s.hyper, momentum);
}

int64_t Optimizer::state_numel() const {
  int64_t n = 0;
  for (const Shard& s : shards_)
    for (const auto& [key, tensor] : s.state) n += tensor.numel();
  return n;
}

}  // namespace dscpp::optim
