// train_gpt's MoE pieces: see moe_training.h.
#include "moe_training.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>

#include "dscpp/comm/expert_groups.h"
#include "dscpp/comm/rendezvous.h"
#include "dscpp/comm/topology.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/nn/moe/router.h"

namespace dscpp::examples {

std::shared_ptr<comm::ProcessGroup> expert_parallel_group(const model_zoo::GPTConfig& config,
                                                          const comm::Topology& topology) {
  const int ep = static_cast<int>(config.parallelism.expert_model_parallel_size);
  if (ep <= 1) return nullptr;
  return comm::new_expert_groups(*comm::init_distributed(), topology, ep).expert_parallel;
}

std::shared_ptr<comm::ProcessGroup> expert_parallel_group(const model_zoo::GPTConfig& config) {
  if (config.parallelism.expert_model_parallel_size <= 1) return nullptr;
  // A data-parallel job: the data axis is the world.
  const int world = comm::init_distributed()->size();
  return expert_parallel_group(config, comm::Topology({"pipe", "data", "model"}, {1, world, 1}));
}

MoETraining::MoETraining(const model_zoo::GPTConfig& config, torch::nn::Module& model,
                         std::shared_ptr<comm::ProcessGroup> data_group, at::Device device,
                         std::shared_ptr<comm::ProcessGroup> report_group, int64_t replicas,
                         std::shared_ptr<comm::ProcessGroup> shard_group)
    : active_(config.moe.enabled()),
      expert_bias_(config.moe.moe_router_enable_expert_bias),
      model_(&model),
      data_group_(std::move(data_group)),
      report_group_(report_group ? std::move(report_group) : data_group_),
      shard_group_(shard_group && shard_group->size() > 1 ? std::move(shard_group) : nullptr),
      device_(device),
      num_experts_(config.moe.num_experts),
      replicas_(std::max<int64_t>(replicas, 1)) {
  int64_t row = 0;
  for (int64_t i = 0; i < config.num_layers; ++i)
    moe_row_.push_back(config.moe.is_moe_layer(i) ? row++ : -1);
}

void MoETraining::add_aux(const at::Tensor& aux, int64_t accumulation) {
  if (!active_ || !aux.defined()) return;
  const at::Tensor a = aux.detach().to(at::kDouble) / static_cast<double>(accumulation);
  if (!aux_.defined())
    aux_ = a.clone();
  else
    aux_.add_(a.to(aux_.device()));
}

void MoETraining::after_boundary() {
  if (active_ && expert_bias_) nn::moe::update_expert_biases(*model_, data_group_);
}

std::string MoETraining::interval_report(int64_t steps) {
  if (!active_) return "";
  const auto f64 = at::TensorOptions().dtype(at::kDouble).device(device_);
  // One all-reduce for both: [aux, the counts of MoE layer 0, layer 1, ...], each layer's row
  // by its place among the model's MoE layers (zeros where this rank holds it not, or it
  // routed nothing this interval: no training forward).
  const int64_t layers = static_cast<int64_t>(
      std::count_if(moe_row_.begin(), moe_row_.end(), [](int64_t r) { return r >= 0; }));
  at::Tensor flat = at::zeros({1 + layers * num_experts_}, f64);
  if (aux_.defined()) flat[0].copy_(aux_.reshape({}));
  if (shard_group_) {
    // Each tensor rank's aux losses are its shard's parts: the micro-batch's are their sum.
    at::Tensor parts = flat.narrow(0, 0, 1).clone();
    shard_group_->all_reduce(parts, comm::ReduceOp::kSum).wait();
    flat.narrow(0, 0, 1).copy_(parts);
  }
  for (const auto& s : model_zoo::take_moe_stats(*model_)) {
    if (!s.tokens_per_expert.defined() || s.layer < 0 ||
        s.layer >= static_cast<int64_t>(moe_row_.size()) || moe_row_[s.layer] < 0)
      continue;
    flat.narrow(0, 1 + moe_row_[s.layer] * num_experts_, num_experts_)
        .copy_(s.tokens_per_expert.reshape({-1}));
  }
  report_group_->all_reduce(flat, comm::ReduceOp::kSum).wait();
  if (replicas_ > 1) flat.div_(static_cast<double>(replicas_));
  const double aux_mean = flat[0].item<double>() /
                          static_cast<double>(data_group_->size() * std::max<int64_t>(steps, 1));
  aux_ = at::Tensor();
  if (layers == 0 || num_experts_ == 0) return fmt::format(" | aux loss {:.6f}", aux_mean);
  const at::Tensor per_layer = flat.narrow(0, 1, layers * num_experts_).view({layers, -1});
  const at::Tensor ratio = per_layer.amax(1) / per_layer.mean(1).clamp_min(1e-12);
  return fmt::format(
      " | aux loss {:.6f} | load balance {:.2f} (worst {:.2f}, max/mean tokens "
      "per expert over {} MoE layers)",
      aux_mean, ratio.mean().item<double>(), ratio.max().item<double>(), layers);
}

}  // namespace dscpp::examples
