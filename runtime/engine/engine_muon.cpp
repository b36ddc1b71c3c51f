// DeepSpeed's "type": "Muon" in the engine: the parameters Muon steps form one more partition
// of the ZeRO set (engine_core.h, ZeroPartition), over the data group, with ZeroOptimizer's
// whole-parameter layout: every matrix lies whole in one rank's partition (owners balanced by
// Newton-Schulz's work), its owner orthogonalises it once, and the publish brings it to the
// others. The rest (embeddings, the output head, norms, biases) stay in the dense partition,
// stepped by the auxiliary Adam (optim/muon.h: make_muon_halves).
//
// Which parameters: DeepSpeed's set_optimizer_flags rule (a matrix, its name holding neither
// "embed" nor "lm_head"), overridden by name with InitArgs::use_muon as DeepSpeed's
// `param.use_muon`. The norm: the Muon partition's share is added to the dense one's local sum
// before the data group's, as the experts' is; both step with that one sum. The clip scales
// the gradient before Muon's momentum takes it, as DeepSpeed's Muon without ZeRO does.
// With an LR schedule, the schedule's lr reaches Muon too (DeepSpeed's schedulers write every
// param group's lr, both halves').
//
// On a pipeline each stage's engine holds its stage's Muon partition; the pipeline's norm
// adds the stages' shares as for the dense partition. Under tensor parallelism a split matrix
// is gathered over the model group and orthogonalised whole (zero::ZeroOptions::model_split_of),
// as one rank orthogonalises it. Under ZeRO-Offload the Muon partition's master and momentum are
// on the host and each matrix's Newton-Schulz runs on the training device (optim::Muon::
// set_compute_device). With expert parallelism (ep_size > 1) the experts' partition, over the
// expert-data group, steps by Muon (each expert of a stacked group orthogonalised on its own,
// once, by the rank that owns the group); refused naming them: expert parameters that are not
// matrices, and experts with tensor parallelism, ZeRO-Offload or parameter groups. Parameter
// groups split into their Muon and Adam halves, as DeepSpeed's _muon_param_groups does
// (take_muon).
// Checkpoints hold the Muon half as DeepSpeed's do: the first parameter group, its
// momentum_buffer partitioned as DeepSpeed partitions the group (checkpoint_partitions).
#include <algorithm>
#include <map>
#include <set>

#include "dscpp/config/config_error.h"
#include "dscpp/config/section.h"
#include "dscpp/error.h"
#include "dscpp/runtime/engine/engine_core.h"
#include "dscpp/runtime/engine/engine_experts.h"
#include "dscpp/runtime/engine/tensor_parallel_grads.h"
#include "dscpp/runtime/engine/universal_load.h"

namespace dscpp {

namespace {

// DeepSpeed's default: a matrix whose name holds neither "embed" nor "lm_head".
bool muon_by_default(const std::string& name, const at::Tensor& p) {
  const std::string n = config::lower(name);
  return p.dim() >= 2 && n.find("embed") == std::string::npos &&
         n.find("lm_head") == std::string::npos;
}

}  // namespace

void EngineCore::take_muon(std::vector<at::Tensor>& params, zero::ZeroOptions& zo,
                           std::unique_ptr<optim::Optimizer> muon) {
  auto refuse = [](const std::string& what) {
    throw ConfigError("optimizer.type", "\"Muon\" with " + what + " is not implemented yet");
  };
  std::set<std::string> known(param_names_.begin(), param_names_.end());
  if (experts_) {
    // The experts' partition steps by Muon too (add_expert_partition): each expert matrix
    // orthogonalised once, by its owner in the expert-data group. Its matrices only: an
    // expert's bias would need an Adam half of that partition.
    if (tensor_parallel_size() > 1) refuse("expert parallelism and tensor parallelism together");
    if (zo.offload.enabled) refuse("expert parallelism under ZeRO-Offload");
    if (!zo.group_options.empty()) refuse("expert parallelism and parameter groups");
    for (size_t i = 0; i < experts_->names().size(); ++i) {
      const std::string& name = experts_->names()[i];
      known.insert(name);
      auto it = client_.use_muon.find(name);
      if (experts_->params()[i].dim() < 2 || (it != client_.use_muon.end() && !it->second))
        refuse("expert parallelism and the expert parameter '" + name +
               "', which Muon would not step (not a matrix, or use_muon false): every expert "
               "parameter of ep_size > 1 is Muon's");
    }
  }
  for (const auto& [name, on] : client_.use_muon)
    if (!known.count(name))
      throw dscpp::Error("initialize: use_muon names '" + name +
                         "', which is not a trainable parameter of the module");
  std::vector<at::Tensor> kept, taken;
  std::vector<std::string> kept_names;
  std::vector<int> kept_units, taken_units, kept_groups, taken_groups;
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = client_.use_muon.find(param_names_[i]);
    const bool on =
        it != client_.use_muon.end() ? it->second : muon_by_default(param_names_[i], params[i]);
    if (on && params[i].dim() < 2)
      throw dscpp::Error("initialize: use_muon is true for '" + param_names_[i] +
                         "', which is not a matrix: Muon orthogonalises matrices");
    (on ? taken : kept).push_back(params[i]);
    (on ? muon_names_ : kept_names).push_back(param_names_[i]);
    if (!zo.unit_of.empty()) (on ? taken_units : kept_units).push_back(zo.unit_of[i]);
    if (!zo.group_of.empty()) (on ? taken_groups : kept_groups).push_back(zo.group_of[i]);
  }
  if (taken.empty()) return;  // no matrix: the auxiliary Adam steps everything
  params = std::move(kept);
  param_names_ = std::move(kept_names);
  if (!zo.unit_of.empty()) zo.unit_of = std::move(kept_units);
  // Gathered whole around forward and backward at stage 3 (the layer gathers are the dense
  // partition's), as the experts' partition is.
  zero::ZeroOptions mo = zo;
  mo.unit_of.clear();
  mo.defer_allgather = false;
  // Tensor parallelism: a split matrix is orthogonalised whole, gathered over the model group,
  // as one rank would (Newton-Schulz of each slice alone is a different update); each model
  // rank's owner of the matrix does it, and keeps its slice.
  if (tensor_parallel_size() > 1) {
    mo.model_group = model_group_;
    for (const auto& name : muon_names_) {
      auto it = tp_attrs_->find(name);
      zero::ZeroOptions::ModelSplit split;
      if (it != tp_attrs_->end() && it->second.tensor_model_parallel) {
        split.dim = it->second.partition_dim;
        split.stride = it->second.partition_stride;
      }
      mo.model_split_of.push_back(split);
    }
  }
  // Parameter groups, as DeepSpeed's _muon_param_groups splits them: each group into its Muon
  // half and its Adam half, a half taking the group's own settings among its keys over the
  // config's (most specific last); a group with no parameter of a half has no group there.
  if (!zo.group_of.empty()) {
    const std::vector<optim::Hyper> given = zo.group_options;
    auto half = [&given](std::vector<int>& group_of, std::vector<optim::Hyper>& options,
                         std::initializer_list<const char*> keys) {
      std::map<int, int> compact;  // a client group -> the half's group
      for (int g : group_of) compact.emplace(g, 0);
      options.clear();
      for (auto& [g, h] : compact) {
        h = static_cast<int>(options.size());
        optim::Hyper mine = optim::Hyper::object();
        for (const char* key : keys)
          if (given.at(g).contains(key)) mine[key] = given.at(g)[key];
        options.push_back(std::move(mine));
      }
      for (int& g : group_of) g = compact.at(g);
    };
    half(taken_groups, mo.group_options, {"lr", "momentum", "weight_decay", "ns_method"});
    half(kept_groups, zo.group_options, {"lr", "betas", "eps", "weight_decay"});
    mo.group_of = std::move(taken_groups);
    zo.group_of = std::move(kept_groups);
  }
  muon_zero_ = std::make_unique<zero::ZeroOptimizer>(std::move(taken), std::move(muon), group_, mo);
}

void EngineCore::add_muon_partition() {
  if (!muon_zero_) return;
  zero::ZeroOptimizer* z = muon_zero_.get();
  ZeroPartition p;
  p.name = "muon";
  p.zero = z;
  p.group = group_.get();
  p.names = &muon_names_;
  // This rank's partition (stages 1-3: the data group's sum covers the matrices once; stage 0:
  // every rank holds them all, and the dense sum is not reduced further).
  // Tensor parallelism: a replicated matrix counts on tensor rank 0 only (the dense sum's rule);
  // the model group's all-reduce of the dense sum, after this, adds the tensor ranks.
  if (tensor_parallel_size() > 1) {
    std::vector<nn::TensorParallelAttr> attrs;
    for (const auto& name : muon_names_) {
      auto it = tp_attrs_->find(name);
      attrs.push_back(it != tp_attrs_->end() ? it->second : nn::TensorParallelAttr{});
    }
    muon_tp_grads_ = std::make_unique<TensorParallelGrads>(*z, model_group_, std::move(attrs));
    p.tp_grads = muon_tp_grads_.get();
  }
  p.add_sumsq = [this, z](at::Tensor& sumsq) {
    at::Tensor mine = z->master().local_sumsq().to(sumsq.options());
    if (muon_tp_grads_) mine = mine - muon_tp_grads_->duplicate_sumsq().to(mine.options());
    sumsq = sumsq + mine;
  };
  p.follow_schedule = [this, z](const optim::Optimizer& first) {
    if (scheduler_) z->optimizer().set_lr(first.get_lr());
  };
  p.load_by_name = [this, z](const engine_checkpoint::WholeParams& whole, bool states) {
    // Under tensor parallelism each rank cuts its slice of each split matrix, as the dense
    // partition does.
    const int t = tensor_parallel_size();
    std::map<std::string, checkpoint::ParamPartition> parts;
    if (t > 1) parts = engine_checkpoint::partitions_of(tensor_parallel_info());
    engine_checkpoint::load_partition_by_name(*z, muon_names_, whole, states,
                                              t > 1 ? &parts : nullptr, tensor_parallel_rank());
  };
  zero_set_.push_back(std::move(p));
}

std::vector<const ZeroPartition*> EngineCore::checkpoint_partitions() const {
  std::vector<const ZeroPartition*> out;
  for (const auto& p : zero_set_)
    if (p.zero == muon_zero_.get()) out.push_back(&p);
  for (const auto& p : zero_set_)
    if (p.zero != muon_zero_.get()) out.push_back(&p);
  return out;
}

}  // namespace dscpp
