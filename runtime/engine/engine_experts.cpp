// EngineExperts: see engine_experts.h.
#include "dscpp/runtime/engine/engine_experts.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <set>

#include "dscpp/config/ds_config.h"
#include "dscpp/error.h"
#include "dscpp/optim/muon.h"
#include "dscpp/optim/optimizer.h"
#include "dscpp/runtime/engine/engine_core.h"
#include "dscpp/runtime/engine/universal_load.h"
#include "dscpp/runtime/precision/loss_scaler.h"

namespace dscpp {

namespace {

// The data-group ranks at the same place of their expert-parallel groups hold the same experts:
// one expert-data group per place. Each rank's (ep_size, ep_rank, whether its expert-parallel
// group lies inside the data group) gathered over the data group; every rank checks the same
// gathered values, so they all throw alike or none does.
std::shared_ptr<comm::ProcessGroup> make_expert_data_group(comm::ProcessGroup& data, int ep_size,
                                                           int ep_rank,
                                                           const comm::ProcessGroup* ep) {
  std::set<int> members;
  for (int r = 0; r < data.size(); ++r) members.insert(data.global_rank(r));
  bool inside = ep != nullptr && ep->size() == ep_size;
  for (int r = 0; inside && r < ep->size(); ++r) inside = members.count(ep->global_rank(r)) > 0;
  at::Tensor mine = at::tensor({int64_t{ep_size}, int64_t{ep_rank}, int64_t{inside}}, at::kLong);
  const bool cuda = data.backend_name() == "nccl";
  if (cuda) mine = mine.cuda();
  at::Tensor all = at::empty({data.size() * 3}, mine.options());
  data.all_gather(all, mine).wait();
  all = all.cpu().view({data.size(), 3});
  std::vector<std::vector<int>> places(ep_size);
  for (int r = 0; r < data.size(); ++r) {
    const int64_t size = all[r][0].item<int64_t>(), place = all[r][1].item<int64_t>();
    if (size != ep_size)
      throw Error(fmt::format(
          "initialize: the MoE layers' ep_size must be the same on every rank of the data group "
          "'{}': rank {} has {}, rank {} has {}",
          data.name(), data.rank(), ep_size, r, size));
    if (all[r][2].item<int64_t>() == 0)
      throw Error(fmt::format(
          "initialize: the expert-parallel group of data rank {} (ep_size {}) does not lie inside "
          "the engine's data group '{}': pass its expert-data group as "
          "InitArgs::expert_data_group",
          r, ep_size, data.name()));
    places[place].push_back(r);
  }
  std::shared_ptr<comm::ProcessGroup> mine_group;
  for (int p = 0; p < ep_size; ++p) {
    if (static_cast<int>(places[p].size()) != data.size() / ep_size)
      throw Error(fmt::format(
          "initialize: the expert-parallel groups do not tile the data group '{}': {} ranks hold "
          "expert-parallel place {} (expected {})",
          data.name(), places[p].size(), p, data.size() / ep_size));
    auto g = data.new_subgroup(places[p], fmt::format("expert_data_parallel_ep{}_{}", ep_size, p));
    if (g) mine_group = g;
  }
  return mine_group;
}

}  // namespace

std::unique_ptr<EngineExperts> EngineExperts::take(
    const ExpertMap& experts, std::vector<at::Tensor>& params, std::vector<std::string>& names,
    zero::ZeroOptions& zo, const std::shared_ptr<comm::ProcessGroup>& data_group,
    std::shared_ptr<comm::ProcessGroup> expert_data_group,
    const std::shared_ptr<comm::ProcessGroup>& model_group,
    const std::map<std::string, nn::TensorParallelAttr>* tp_attrs) {
  const bool tensor_parallel = model_group && model_group->size() > 1;
  if (tensor_parallel && !tp_attrs)
    throw Error(
        "initialize: experts with tensor parallelism need the parameters' "
        "tensor-parallel attributes (InitArgs::tensor_parallel)");
  auto out = std::unique_ptr<EngineExperts>(new EngineExperts());
  std::vector<at::Tensor> dense;
  std::vector<std::string> dense_names;
  std::vector<int> dense_groups, dense_units;
  const nn::moe::ExpertParam* first = nullptr;
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = experts.find(names[i]);
    // Experts at ep_size 1 are replicated over the data group like any dense parameter.
    if (it == experts.end() || it->second.ep_size <= 1) {
      dense.push_back(params[i]);
      dense_names.push_back(names[i]);
      if (!zo.group_of.empty()) dense_groups.push_back(zo.group_of[i]);
      if (!zo.unit_of.empty()) dense_units.push_back(zo.unit_of[i]);
      continue;
    }
    const auto& e = it->second;
    if (!first) first = &e;
    if (e.ep_size != first->ep_size || e.ep_rank != first->ep_rank)
      throw Error(fmt::format(
          "initialize: the engine takes one ep_size for all MoE layers with expert parallelism: "
          "'{}' has ep_size {} (rank {}), '{}' ep_size {} (rank {})",
          names[i], e.ep_size, e.ep_rank, out->names_.front(), first->ep_size, first->ep_rank));
    if (tensor_parallel) {
      auto attr = tp_attrs->find(names[i]);
      if (attr == tp_attrs->end())
        throw Error("initialize: expert parameter '" + names[i] +
                    "' has no tensor-parallel attributes (InitArgs::tensor_parallel)");
      out->tp_attrs_.push_back(attr->second);
    }
    out->params_.push_back(params[i]);
    out->names_.push_back(names[i]);
    out->info_.emplace(names[i], e);
    if (!zo.group_of.empty()) out->group_of_.push_back(zo.group_of[i]);
  }
  if (!first) return nullptr;
  if (tensor_parallel) out->model_ = model_group;
  out->data_ = data_group;
  out->ep_size_ = static_cast<int>(first->ep_size);
  out->ep_rank_ = static_cast<int>(first->ep_rank);
  out->ep_ = first->ep_group;
  const int d = data_group->size();
  if (d % out->ep_size_ != 0)
    throw Error(fmt::format("initialize: ep_size {} must divide the data-parallel size {}",
                            out->ep_size_, d));
  if (expert_data_group) {
    if (expert_data_group->size() != d / out->ep_size_)
      throw Error(fmt::format(
          "initialize: InitArgs::expert_data_group has {} ranks; with a data group of {} and "
          "ep_size {} it must have {}",
          expert_data_group->size(), d, out->ep_size_, d / out->ep_size_));
    out->edp_ = std::move(expert_data_group);
  } else {
    out->edp_ = make_expert_data_group(*data_group, out->ep_size_, out->ep_rank_, out->ep_.get());
  }
  params = std::move(dense);
  names = std::move(dense_names);
  if (!zo.group_of.empty()) zo.group_of = std::move(dense_groups);
  if (!zo.unit_of.empty()) zo.unit_of = std::move(dense_units);
  return out;
}

void EngineExperts::build(const zero::ZeroOptions& zo, std::unique_ptr<optim::Optimizer> optimizer,
                          const optim::Optimizer& dense) {
  zero::ZeroOptions eo = zo;
  eo.group_of = group_of_;
  eo.unit_of.clear();                // gathered as a whole at stage 3
  eo.defer_allgather = false;        // published at the step
  eo.reduce_sumsq_across = nullptr;  // the dense optimizer's sum carries the experts' (add_sumsq)
  // (over the data ranks: with sequence parallelism the dense options' average_over counts
  // them, the sequence ranks' shares being summed)
  eo.average_over = zo.average_over > 0 ? zo.average_over : data_->size();
  zero_ = std::make_unique<zero::ZeroOptimizer>(params_, std::move(optimizer), edp_, eo);
  if (model_) tp_grads_ = std::make_unique<TensorParallelGrads>(*zero_, model_, tp_attrs_);
  if (zero_->optimizer().num_shards() > dense.num_shards())
    throw Error(fmt::format(
        "initialize: parameter group {} holds only expert parameters (ep_size > 1); the engine "
        "schedules the experts' groups through the dense ones: give that group a dense "
        "parameter too, or merge it into another",
        zero_->optimizer().num_shards() - 1));
}

void EngineExperts::add_sumsq(at::Tensor& dense_local_sumsq) {
  at::Tensor mine = zero_->master().local_sumsq().to(dense_local_sumsq.options());
  // Tensor parallelism: a replica counts on tensor rank 0 only (the dense sum's own rule); the
  // model group's all-reduce of the dense sum, after this, adds the tensor ranks.
  if (tp_grads_) mine = mine - tp_grads_->duplicate_sumsq().to(mine.options());
  // Stage 0: each rank holds its experts' whole averaged gradients (its expert-data group's
  // replicas agree), and the dense sum is not reduced further: the expert-parallel group's
  // experts are summed here. Stages 1-3: the data group's all-reduce sums the partitions.
  if (zero_->stage() == 0 && ep_ && ep_->size() > 1) ep_->all_reduce(mine).wait();
  dense_local_sumsq = dense_local_sumsq + mine;
}

// EngineCore's side (engine_core.h), here to keep engine_core.cpp to its one job.

zero::ZeroOptimizer* EngineCore::expert_zero_optimizer() {
  return experts_ ? &experts_->zero() : nullptr;
}

const std::shared_ptr<comm::ProcessGroup>& EngineCore::expert_data_group() const {
  static const std::shared_ptr<comm::ProcessGroup> none;
  return experts_ ? experts_->expert_data_group() : none;
}

void EngineCore::take_experts(std::vector<at::Tensor>& params, zero::ZeroOptions& zo) {
  if (!client_.expert_params) return;
  experts_ = EngineExperts::take(*client_.expert_params, params, param_names_, zo, group_,
                                 client_.expert_data_group, model_group_, tp_attrs_.get());
}

void EngineCore::add_expert_partition(const zero::ZeroOptions& zo, const optim::Optimizer& dense) {
  if (!experts_) return;
  // "type": "Muon": every expert parameter is a matrix (take_muon checked), stepped by Muon.
  const bool muon = config_.optimizer && optim::is_muon(*config_.optimizer);
  std::unique_ptr<optim::Optimizer> optimizer;
  if (muon) {
    optimizer = std::move(optim::make_muon_halves(*config_.optimizer).muon);
  } else {
    optimizer = config_.optimizer ? optim::make_optimizer(*config_.optimizer) : client_.optimizer();
    if (!optimizer) throw Error("initialize: the client optimizer factory gave null");
    optimizer->set_cpu_kernels(dense.cpu_kernels());
  }
  experts_->build(zo, std::move(optimizer), dense);
  EngineExperts* ex = experts_.get();
  ZeroPartition p;
  p.name = "experts";
  p.zero = &ex->zero();
  p.group = ex->expert_data_group().get();
  p.names = &ex->names();
  // Their share of the norm (a local term at stages 1-3), before what the client adds (a
  // pipeline's other stages, whose experts are counted by the same sums).
  p.add_sumsq = [ex](at::Tensor& sumsq) { ex->add_sumsq(sumsq); };
  p.tp_grads = ex->tp_grads();
  // The LR schedule's settings, group by group (build checked that the experts have no group
  // of their own): the same optimizer kind as the dense one.
  // Muon's: the schedule's lr, as DeepSpeed's schedulers write every group's (the Muon
  // partition's rule).
  p.follow_schedule = [this, ex, muon](const optim::Optimizer& first) {
    optim::Optimizer& mine = ex->zero().optimizer();
    if (muon) {
      if (scheduler_) mine.set_lr(first.get_lr());
      return;
    }
    for (int g = 0; g < mine.num_shards(); ++g) mine.copy_hyper(g, first, g);
  };
  // The normal form holds the one-rank model's experts (every global expert; replicated over
  // tensor ranks): this expert-parallel rank's are cut from them per global expert.
  p.load_by_name = [this, ex](const engine_checkpoint::WholeParams& whole, bool states) {
    engine_checkpoint::load_experts_by_name(ex->zero(), ex->names(), *client_.expert_params, whole,
                                            states);
  };
  zero_set_.push_back(std::move(p));
}

}  // namespace dscpp
