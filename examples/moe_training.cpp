// train_gpt's MoE pieces: see moe_training.h.
#include "moe_training.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "dscpp/comm/expert_groups.h"
#include "dscpp/comm/rendezvous.h"
#include "dscpp/comm/topology.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/nn/moe/router.h"

namespace dscpp::examples {

std::shared_ptr<comm::ProcessGroup> expert_parallel_group(const model_zoo::GPTConfig& config) {
  const int ep = static_cast<int>(config.parallelism.expert_model_parallel_size);
  if (ep <= 1) return nullptr;
  auto world = comm::init_distributed();
  // train_gpt's MoE runs are data parallel only: the data axis is the world.
  comm::Topology topo({"pipe", "data", "model"}, {1, world->size(), 1});
  return comm::new_expert_groups(*world, topo, ep).expert_parallel;
}

void check_moe_job(const model_zoo::GPTConfig& config, const GptOptions& options) {
  if (!config.moe.enabled()) return;
  const auto& par = config.parallelism;
  if (par.tensor_model_parallel_size > 1 || par.pipeline_model_parallel_size > 1 ||
      options.pipeline_model_parallel_size > 1)
    throw FlagError(fmt::format(
        "{}: an MoE model (num_experts {}) trains with data and expert parallelism only in "
        "train_gpt so far: expected tensor and pipeline degrees 1, found {} and {}",
        options.model_config, config.moe.num_experts, par.tensor_model_parallel_size,
        std::max(par.pipeline_model_parallel_size, options.pipeline_model_parallel_size)));
}

MoETraining::MoETraining(const model_zoo::GPTConfig& config, torch::nn::Module& model,
                         std::shared_ptr<comm::ProcessGroup> data_group)
    : active_(config.moe.enabled()),
      expert_bias_(config.moe.moe_router_enable_expert_bias),
      model_(&model),
      data_group_(std::move(data_group)) {}

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
  const auto stats = model_zoo::take_moe_stats(*model_);
  // Every rank has the same MoE layers; a layer that routed nothing this interval (no
  // training forward) counts zeros.
  std::vector<at::Tensor> counts;
  at::Device device = aux_.defined() ? aux_.device() : at::Device(at::kCPU);
  for (const auto& s : stats)
    if (s.tokens_per_expert.defined()) device = s.tokens_per_expert.device();
  const int64_t experts = stats.empty() || !stats[0].tokens_per_expert.defined()
                              ? 0
                              : stats[0].tokens_per_expert.numel();
  for (const auto& s : stats)
    counts.push_back(
        s.tokens_per_expert.defined()
            ? s.tokens_per_expert.to(at::kDouble)
            : at::zeros({experts}, at::TensorOptions().dtype(at::kDouble).device(device)));
  // One all-reduce for both: [aux, counts of layer 0, layer 1, ...].
  at::Tensor aux = aux_.defined()
                       ? aux_.to(device)
                       : at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  std::vector<at::Tensor> parts = {aux.reshape({1})};
  for (const auto& c : counts) parts.push_back(c.reshape({-1}));
  at::Tensor flat = at::cat(parts);
  data_group_->all_reduce(flat, comm::ReduceOp::kSum).wait();
  const double aux_mean = flat[0].item<double>() /
                          static_cast<double>(data_group_->size() * std::max<int64_t>(steps, 1));
  double mean_ratio = 0, worst = 0;
  int64_t layers = 0;
  if (experts > 0) {
    const at::Tensor per_layer = flat.narrow(0, 1, flat.numel() - 1).view({-1, experts});
    const at::Tensor mean = per_layer.mean(1);
    const at::Tensor ratio = per_layer.amax(1) / mean.clamp_min(1e-12);
    layers = ratio.numel();
    mean_ratio = ratio.mean().item<double>();
    worst = ratio.max().item<double>();
  }
  aux_ = at::Tensor();
  if (layers == 0) return fmt::format(" | aux loss {:.6f}", aux_mean);
  return fmt::format(
      " | aux loss {:.6f} | load balance {:.2f} (worst {:.2f}, max/mean tokens "
      "per expert over {} MoE layers)",
      aux_mean, mean_ratio, worst, layers);
}

}  // namespace dscpp::examples
