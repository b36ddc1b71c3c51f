// Expert parameters in the engine's ZeRO. DeepSpeed makes its users split their parameter
// groups (split_params_into_different_moe_groups_for_optimizer) so that ZeRO reduces and
// partitions the experts over the expert-data-parallel group; here the engine finds them itself
// (nn::moe::expert_parameters on the module: InitArgs::expert_params) and, where any has
// ep_size > 1, gives them a second ZeroOptimizer of the same stage over the expert-data group,
// the dense parameters keeping theirs over the data group: the second partition of the engine's
// set (engine_core.h, ZeroPartition), which the engine drives like the first. One mechanism for
// both: the same ZeroOptimizer, buckets and partition code, with two differences of options.
//   - Averaging: an expert's gradient already sums the tokens of its expert-parallel group, so
//     the expert-data group's sum is divided by the whole data group's size (DeepSpeed's
//     _reduce_expert_gradients and its ZeRO 1-2 divide by the data world, "to maintain the
//     gradients value unaffected by ep_size"): ZeroOptions::average_over.
//   - The norm: one for the whole model, each expert parameter counted once over the world.
//     The dense optimizer's reduce_sumsq_across adds the experts' share (add_sumsq, the
//     partition's) before its data-group sum: at stages 1-3 this rank's expert partition (the
//     partitions of an expert-data group cover its experts once, the expert-parallel groups'
//     experts are disjoint, and together they make the data group), at stage 0 the sum of this
//     rank's whole experts over its expert-parallel group (the dense sum is not reduced there).
//     Both optimizers then step with that one sum (ZeroOptimizer::step(loss_scale, sumsq)): one
//     clip, one overflow verdict, one loss scale. (DeepSpeed's ZeRO 1-2 instead averages the expert
//     groups' norms over the expert-data group, which is not the model's norm: we take the exact
//     one.)
// The expert-data group: InitArgs::expert_data_group when given (its size must be the data
// group's over ep_size), otherwise made here from the MoE layers' own expert-parallel groups:
// the data-group ranks at the same place of their expert-parallel groups hold the same experts
// (comm::new_expert_groups' layout, and any other that tiles the data group).
// At stage 3 the experts are gathered as a whole around each forward and backward (not layer
// by layer); with deferred all-gathers they publish at the step. The LR schedule drives the
// dense optimizer; its groups' settings are copied into the experts' before each step.
// Tensor parallelism (a model group of t > 1 ranks): the expert-parallel groups lie inside the
// data group of one tensor rank, so the expert-data group made here is that tensor rank's, and
// the experts are replicas over the tensor group (DeepSpeed's layout for ep_size with an mpu).
// Their tensor-parallel attributes come from the model like every parameter's: with the MoE
// layer's token split (nn/moe/moe.h) they are sequence_parallel, partial sums over the tensor
// group, which a TensorParallelGrads over the experts' partition sums at the step before the
// norm (the dense partition's twin; tensor ranks at one data index hold the same expert
// layout and expert-data rank, so their partitions cover the same elements); and a replica
// counts in the norm on tensor rank 0 only.
// With "type": "Muon" (or MuonH) the experts' optimizer is Muon's (engine_muon.cpp): every expert
// parameter a matrix, each stacked group whole in one rank's partition.
// Not yet: several ep_size values in one model.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/nn/moe/expert_params.h"
#include "dscpp/nn/tensor_parallel_attr.h"
#include "dscpp/runtime/engine/tensor_parallel_grads.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp {

class EngineExperts {
 public:
  using ExpertMap = std::map<std::string, nn::moe::ExpertParam>;

  // Takes the parameters of `experts` with ep_size > 1 out of params / names (in their order,
  // and their entries out of zo.group_of and zo.unit_of); null when there are none (nothing
  // changed then). data_group: the engine's; expert_data_group: InitArgs's (null: made from
  // the layers' groups, collectively over data_group: every rank of it must have the same MoE
  // layers). model_group: the engine's tensor-parallel group (null: none) and tp_attrs the
  // parameters' attributes by name (needed when model_group has more than one rank).
  static std::unique_ptr<EngineExperts> take(
      const ExpertMap& experts, std::vector<at::Tensor>& params, std::vector<std::string>& names,
      zero::ZeroOptions& zo, const std::shared_ptr<comm::ProcessGroup>& data_group,
      std::shared_ptr<comm::ProcessGroup> expert_data_group,
      const std::shared_ptr<comm::ProcessGroup>& model_group,
      const std::map<std::string, nn::TensorParallelAttr>* tp_attrs);

  // The experts' ZeroOptimizer, over the expert-data group, with the dense one's options `zo`
  // (after take: the dense ones) and an optimizer made alike. dense: the dense optimizer, which
  // must have every parameter group the experts have (the schedule writes its groups).
  void build(const zero::ZeroOptions& zo, std::unique_ptr<optim::Optimizer> optimizer,
             const optim::Optimizer& dense);

  // The experts' share of the whole model's sum of squares, added to the dense optimizer's
  // local sum before its data-group all-reduce (see above). Collective over the
  // expert-parallel group at stage 0.
  void add_sumsq(at::Tensor& dense_local_sumsq);
  // The experts' partial gradients (the token split's), summed over the tensor group before
  // the norm at the accumulation boundary: null without tensor parallelism.
  TensorParallelGrads* tp_grads() { return tp_grads_.get(); }

  zero::ZeroOptimizer& zero() { return *zero_; }
  const std::shared_ptr<comm::ProcessGroup>& expert_data_group() const { return edp_; }
  // The MoE layers' expert-parallel group (the all-to-all), its size and this rank's place.
  const std::shared_ptr<comm::ProcessGroup>& expert_parallel_group() const { return ep_; }
  int ep_size() const { return ep_size_; }
  int ep_rank() const { return ep_rank_; }
  // The expert parameters as the expert ZeroOptimizer holds them, by state_dict name, and
  // what expert_parameters said of each.
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  const ExpertMap& info() const { return info_; }

 private:
  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  ExpertMap info_;
  std::vector<int> group_of_;  // each expert parameter's group (empty: one)
  std::shared_ptr<comm::ProcessGroup> data_, edp_, ep_;
  int ep_size_ = 1, ep_rank_ = 0;
  std::unique_ptr<zero::ZeroOptimizer> zero_;
  std::shared_ptr<comm::ProcessGroup> model_;      // the tensor-parallel group (null: none)
  std::vector<nn::TensorParallelAttr> tp_attrs_;   // each expert parameter's, with model_
  std::unique_ptr<TensorParallelGrads> tp_grads_;  // over zero_'s partition, with model_
};

}  // namespace dscpp
