// Muon on ZeRO's shards: each matrix of a shard updated whole, as DeepSpeed 0.19.8's
// MuonWithAuxAdam updates its Muon parameter groups (runtime/zero/muon/muon_optimizer.py):
//   update = muon_update(grad, momentum_buffer)   (optim/muon_update.h: Nesterov momentum,
//                                                  Newton-Schulz, the sqrt(rows / cols) scale)
//   p <- p · (1 - lr · weight_decay) - lr · update
// Hyper-parameters (DeepSpeed's Muon half of a param group): lr (0.02), momentum (0.95),
// weight_decay (0), ns_method ("gram" | "standard"). State: momentum_buffer, the shard's size.
// The auxiliary Adam half (embeddings, norms, biases, the output head) is an Adam optimizer
// of its own, stepping the other parameters.
//
// needs_whole_params(): the shards it is given hold their matrices whole (ZeRO's whole
// layout), each described by set_shard_params (a rank may own none of a group's: its shard is
// padding); elements outside them stay as they are. A shard never described is refused at its
// first step.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "dscpp/optim/optimizer.h"

namespace dscpp::optim {

class Muon : public Optimizer {
 public:
  // The update of a matrix: DeepSpeed's Muon (muon_update.h), or Marin's MuonH (muonh_update.h:
  // hyper-parameters lr, momentum, nesterov, backend_steps, muon_epsilon, coefficient_type).
  enum class Rule { DeepSpeed, Hyperball };
  // params: the Muon half's settings, read as "optimizer.params" (unknown keys are errors).
  explicit Muon(const Hyper& params, Rule rule = Rule::DeepSpeed);
  std::string name() const override { return rule_ == Rule::Hyperball ? "muonh" : "muon"; }
  std::unique_ptr<Optimizer> make_like() const override { return fresh_copy(*this); }
  bool needs_whole_params() const override { return true; }
  void set_shard_params(int shard, std::vector<ShardParam> params) override;
  // Under ZeRO-Offload: each matrix's momentum and Newton-Schulz on the training device, the
  // weight's update where the shard is (the update's arithmetic as on that device without
  // offload).
  void set_compute_device(c10::Device device) override { compute_device_ = device; }

  // The matrices (or stacked expert groups) this optimizer has orthogonalised so far: the
  // Newton-Schulz work this rank did.
  int64_t orthogonalised() const { return orthogonalised_; }

 protected:
  Hyper resolve(const Hyper& given, const std::string& path, bool strict) const override;
  void init_state(Shard& s) override;
  void update(Shard& s, const at::Tensor& grad) override;
  void update_hyperball(Shard& s, int index, const at::Tensor& grad);

 private:
  std::vector<std::vector<ShardParam>> params_;  // per shard (none: padding only)
  std::vector<char> described_;                  // per shard: set_shard_params called
  int64_t orthogonalised_ = 0;
  std::optional<c10::Device> compute_device_;
  Rule rule_ = Rule::DeepSpeed;
};

// DeepSpeed's "type": "Muon": the optimizers of its two halves, as
// DeepSpeedEngine._muon_param_groups and MuonWithAuxAdam set them up. params: lr (both halves),
// muon_lr and adam_lr (each half's, over lr), momentum, ns_method (Muon's), betas, eps (Adam's),
// weight_decay (both), adam_w_mode (true: AdamW's decay). The Adam half's defaults are
// MuonWithAuxAdam's (lr 3e-4, betas 0.9 / 0.95, eps 1e-10, no decay). Unknown keys are errors
// naming optimizer.params.KEY; per_head_muon is refused (not implemented).
struct MuonHalves {
  std::unique_ptr<Optimizer> muon, adam;
};
// DeepSpeed's "Muon" or Marin's "MuonH" (muonh_update.h; its params: lr (0.02), adam_lr
// (6e-4), momentum, nesterov, backend_steps, muon_epsilon, coefficient_type for the matrices;
// beta1, beta2 (0.9, 0.95) and epsilon (1e-8) for Adam, without weight decay, for the others).
bool is_muon(const OptimizerConfig& config);
MuonHalves make_muon_halves(const OptimizerConfig& config);

}  // namespace dscpp::optim
