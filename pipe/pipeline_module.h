// DeepSpeed's PipelineModule: a model as a list of LayerSpecs split into pipeline stages, of
// which this rank builds only its own (its chunks, with interleaved virtual stages). The
// ranks form a (pipe x data x model) topology in DeepSpeed's order (pipe outermost, model
// fastest; parallel_groups.h), model 1 unless a topology says otherwise; this rank's
// stage module holds its layers' parameters under their whole-model names, so state_dict
// keys are the same on every layout. A tied spec (TiedLayerSpec: the GPT's embedding and its
// output head) on several stages is built on each, and the copies start from the first
// holder's values (broadcast at construction); their gradients are summed by the engine.
// With a model axis the specs are tensor-parallel layers built on groups()->model, which the
// caller makes first (make_parallel_groups) and passes as PipelineOptions::groups; tied copies
// are per model rank (each holds its own shard).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/comm/topology.h"
#include "dscpp/nn/layer_spec.h"
#include "dscpp/pipe/parallel_groups.h"
#include "dscpp/pipe/schedule.h"

namespace dscpp::pipe {

// DeepSpeed's names for the nn/ types, for users who look for them under pipe.
using LayerSpec = nn::LayerSpec;
using Activation = nn::Activation;
// A spec with a tied_key (and tied_weights): DeepSpeed's TiedLayerSpec(key, ...).
inline nn::LayerSpec TiedLayerSpec(std::string key, nn::LayerSpec spec,
                                   std::vector<std::string> tied_weights = {}) {
  spec.tied_key = std::move(key);
  spec.tied_weights = std::move(tied_weights);
  return spec;
}

// The last stage's loss: (the last layer's outputs, the labels) -> a 0-dim loss.
using LossFn = std::function<at::Tensor(const Activation& outputs, const at::Tensor& labels)>;
// The one-tensor form most models have.
inline LossFn loss_of(std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> f) {
  return [f](const Activation& out, const at::Tensor& labels) { return f(out.at(0), labels); };
}

// PipelineModule's arguments, DeepSpeed's names and defaults, with fluent setters.
struct PipelineOptions {
  explicit PipelineOptions(int num_stages = 0) : num_stages_(num_stages) {}
  // Stages; 0: the topology's pipe axis. With neither, an error.
#define DSCPP_PIPE_OPTION(type, name, init) \
  PipelineOptions& name(type value) {       \
    name##_ = std::move(value);             \
    return *this;                           \
  }                                         \
  const type& name() const {                \
    return name##_;                         \
  }                                         \
  type name##_ = init;
  DSCPP_PIPE_OPTION(int, num_stages, 0)
  // Axes "pipe" and "data" (DeepSpeed's PipeDataParallelTopology), and "model" for tensor
  // parallelism (PipeModelDataParallelTopology); unset: pipe = num_stages, data = the rest.
  DSCPP_PIPE_OPTION(std::optional<comm::Topology>, topology, std::nullopt)
  // The groups, made beforehand by make_parallel_groups (needed with a model axis: the
  // tensor-parallel specs are built on its model group); null: made from the topology.
  DSCPP_PIPE_OPTION(std::shared_ptr<const ParallelGroups>, groups, nullptr)
  DSCPP_PIPE_OPTION(LossFn, loss_fn, nullptr)
  // "parameters" (DeepSpeed's default), "uniform", or "type:REGEX".
  DSCPP_PIPE_OPTION(std::string, partition_method, "parameters")
  // Checkpoint every this many layers of a stage (0: none), DeepSpeed's segments.
  DSCPP_PIPE_OPTION(int, activation_checkpoint_interval, 0)
  DSCPP_PIPE_OPTION(bool, seed_layers, false)  // seed base_seed + layer index before each build
  DSCPP_PIPE_OPTION(int64_t, base_seed, 1234)
  // Model chunks per rank (interleaved 1F1B's virtual stages, Megatron's
  // virtual_pipeline_model_parallel_size); 1: plain 1F1B.
  DSCPP_PIPE_OPTION(int, num_chunks, 1)
  // Two chunks placed in a V, as ZB-V runs them (pipeline.schedule "zb-v"): stage s holds
  // virtual stages s and 2p - 1 - s, so the first stage also holds the last (and computes the
  // loss); false: Megatron's round robin, chunk c of stage s is virtual stage c p + s.
  DSCPP_PIPE_OPTION(bool, v_shape, false)
  // The world group to lay the topology on; null: comm::init_distributed().
  DSCPP_PIPE_OPTION(std::shared_ptr<comm::ProcessGroup>, group, nullptr)
#undef DSCPP_PIPE_OPTION
};

// This rank's layers of one chunk, in order, with their global indices.
struct StageChunk {
  int begin = 0, end = 0;  // [begin, end) of the spec list
  std::vector<nn::Layer> layers;
};

class PipelineModule {
 public:
  PipelineModule(std::vector<nn::LayerSpec> specs, PipelineOptions options);

  int num_stages() const { return stages_; }
  int stage_id() const { return stage_; }
  int data_parallel_size() const { return data_size_; }
  int data_parallel_id() const { return data_id_; }
  int model_parallel_size() const { return groups_->model_size; }
  int model_parallel_id() const { return groups_->model_id; }
  int num_chunks() const { return options_.num_chunks(); }
  bool is_first_stage() const { return stage_ == 0; }
  bool is_last_stage() const { return stage_ == stages_ - 1; }
  // The virtual stage of this rank's chunk c (its place in the model's order of parts), and the
  // stage that holds the last one: the one that computes the loss (the last stage; the first
  // in a V).
  int virtual_stage(int chunk) const;
  int loss_stage() const { return options_.v_shape() ? 0 : stages_ - 1; }
  bool holds_loss() const { return stage_ == loss_stage(); }
  const PipelineOptions& options() const { return options_; }
  const std::vector<nn::LayerSpec>& specs() const { return specs_; }
  // parts[k]: the first spec index of virtual stage k (virtual_stage says where it lives), and
  // parts.back() == specs().size(); DeepSpeed's self.parts.
  const std::vector<int>& parts() const { return parts_; }
  // The module holding this rank's layers (all chunks) under their whole-model names.
  std::shared_ptr<torch::nn::Module> stage_module() const { return module_; }
  // This rank's chunk c.
  const StageChunk& chunk(int c) const { return chunks_.at(c); }
  // Runs chunk c's layers on x, checkpointing every activation_checkpoint_interval layers.
  Activation forward_chunk(int c, const Activation& x) const;

  // The groups the engine communicates on (all made at construction, collectively).
  const std::shared_ptr<comm::ProcessGroup>& world() const { return world_; }
  const std::shared_ptr<comm::ProcessGroup>& data_group() const { return data_group_; }
  // This data index's ranks along the pipe (stage s is group rank s).
  const std::shared_ptr<comm::ProcessGroup>& pipe_group() const { return pipe_group_; }
  // This stage and data index's tensor-parallel ranks; null with model size 1.
  const std::shared_ptr<comm::ProcessGroup>& model_group() const { return groups_->model; }
  const std::shared_ptr<const ParallelGroups>& groups() const { return groups_; }
  // The two-rank group of this stage and stage `peer` (same data index), on which their
  // activations and gradients travel; null when the two are not neighbours.
  std::shared_ptr<comm::ProcessGroup> link(int peer) const;

  // A tied key held on more than one stage: where, and the groups that sum its gradients.
  struct Tied {
    std::string key;
    std::vector<int> stages;          // ascending; stages.front() owns it (norm, weights)
    std::string module_name;          // where its module is registered ("embedding")
    std::vector<std::string> params;  // its tied weights' names inside the module
    std::shared_ptr<comm::ProcessGroup> same_data;  // its stages, this data and model index
    std::shared_ptr<comm::ProcessGroup> all_data;   // its stages x every data index, this model
  };
  // The tied keys this stage holds that live on several stages.
  const std::vector<Tied>& tied() const { return tied_; }

 private:
  void partition();
  void build_chunks();
  void make_tied_groups();
  int stage_of_part(int k) const;  // the stage holding virtual stage k
  PipeShape placement() const;     // this rank's shape as the schedules place chunks

  std::vector<nn::LayerSpec> specs_;
  PipelineOptions options_;
  std::shared_ptr<comm::ProcessGroup> world_, data_group_, pipe_group_;
  std::shared_ptr<const ParallelGroups> groups_;
  int stages_ = 1, stage_ = 0, data_size_ = 1, data_id_ = 0;
  std::vector<int> parts_;
  std::vector<StageChunk> chunks_;
  std::shared_ptr<torch::nn::Module> module_;
  std::vector<Tied> tied_;
};

}  // namespace dscpp::pipe
