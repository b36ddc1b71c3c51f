// train_gpt's MoE pieces (docs/model_zoo.md, "The MoE GPT"): the expert-parallel groups of a job,
// the aux losses' and expert biases' place in the training step, and the log's MoE fields.
//
// Per step: each micro-batch's forward runs under an nn::AuxLossScope and its sum (the MoE
// blocks' coefficient-scaled aux, z and sequence losses) is added to the loss backward sees;
// after the optimizer step at the accumulation boundary the expert biases move
// (nn::moe::update_expert_biases over the data group: the counts of the whole global batch,
// as Megatron sums tokens_per_expert over its data-parallel ranks).
// Per log line: "aux loss" is the mean over the interval's micro-batches (and the data ranks)
// of that scaled sum (on a pipeline, the stages' sums added); "load balance" is max / mean
// tokens per expert of each MoE layer over the interval's routes (summed over the data ranks),
// averaged over the layers, with the worst layer's beside it (1.00: perfectly even).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/comm/topology.h"
#include "dscpp/model_zoo/gpt_config.h"
#include "gpt_flags.h"
#include "train_gpt_pipeline.h"

namespace dscpp::examples {

// The expert-parallel group of this rank for a job laid out on `topology` (a "data" axis;
// comm::new_expert_groups: the expert axis splits the data axis, so on a pipe x data topology
// each group lies inside a stage's data group); null at expert degree 1. Every rank calls it.
std::shared_ptr<comm::ProcessGroup> expert_parallel_group(const model_zoo::GPTConfig& config,
                                                          const comm::Topology& topology);
// The same for a data-parallel job (data x 1: the world is the data axis).
std::shared_ptr<comm::ProcessGroup> expert_parallel_group(const model_zoo::GPTConfig& config);

class MoETraining {
 public:
  // `data_group`: what the engine averages over; `model`: the trained module (GPT, its
  // LayerSpec form, or a pipeline stage's module); `device`: where the report's all-reduce
  // runs; `report_group`: over which the report sums the MoE layers' counts and aux losses
  // (null: data_group; a pipeline: the world, each layer living on one stage); replicas: how
  // many ranks of the report group hold each layer's same routing beside one data rank (a
  // pipeline's tensor degree: its tensor ranks route alike), counted once; `shard_group`: with
  // sequence parallelism the tensor group, over which each rank's aux loss is a part of the
  // whole micro-batch's (nn/moe/router.h), summed for the report (null: none; the counts are
  // already the group's). Inactive (every call a no-op) for a dense config.
  MoETraining(const model_zoo::GPTConfig& config, torch::nn::Module& model,
              std::shared_ptr<comm::ProcessGroup> data_group, at::Device device,
              std::shared_ptr<comm::ProcessGroup> report_group = nullptr, int64_t replicas = 1,
              std::shared_ptr<comm::ProcessGroup> shard_group = nullptr);
  bool active() const { return active_; }
  // One micro-batch's aux-loss sum (undefined: none), weighted 1 / gradient accumulation (a
  // pipeline stage: its PipelineEngine::last_aux_loss(), accumulation 1).
  void add_aux(const at::Tensor& aux, int64_t accumulation);
  // After the step at the accumulation boundary: the expert-bias update, when enabled.
  void after_boundary();
  // " | aux loss A | load balance B (worst C)" for `steps` optimizer steps, then resets.
  // Collective over the report group (and the shard group): every rank calls it.
  std::string interval_report(int64_t steps);

 private:
  bool active_ = false;
  bool expert_bias_ = false;
  torch::nn::Module* model_ = nullptr;
  std::shared_ptr<comm::ProcessGroup> data_group_, report_group_, shard_group_;
  at::Device device_;
  std::vector<int64_t> moe_row_;  // per block: its row among the MoE layers (-1: dense)
  int64_t num_experts_ = 0;
  int64_t replicas_ = 1;  // copies of each layer's routing over the report group
  at::Tensor aux_;        // fp64 0-dim, the interval's sum
};

}  // namespace dscpp::examples
