// DeepSpeed's PipelineEngine: dscpp::initialize(pipeline_module, config) gives one. It runs
// a schedule's instructions (pipe/schedule.h) on this rank's stage: train_batch pulls
// gradient_accumulation_steps micro-batches, runs 1F1B (interleaved with chunks), reduces
// tied and data-parallel gradients and steps; eval_batch runs the inference schedule. The
// config's pipeline.schedule (dscpp's extension) picks ZB-H1 instead, whose split backward runs
// B (the input's gradients) and W (the parameters', ops/deferred_grads.h) as separate
// instructions; ZeRO sees a micro-batch's gradients at its W, so the norm, clipping and the
// overflow check are exactly 1F1B's.
// Activations and gradients travel between neighbours on their two-rank links, each step's
// transfers issued together. ZeRO stages 0-2 run on each stage's data-parallel group through
// EngineCore (stages 0-1 reduce in the last backward of the batch, stage 2 every micro-batch);
// the norm, clip and fp16 overflow verdict are the whole model's (tied weights once). With a
// model axis (tensor parallelism) ZeRO stays on the data group, the norm also sums over the
// model group (each replica once), tied gradients are summed per model rank, and activations
// travel between the neighbours of the same model rank. MoE layers with expert parallelism
// (ep_size > 1, their expert-parallel groups inside each stage's data group: DeepSpeed's
// groups) have their experts reduced and partitioned over the expert-data group by EngineCore's
// expert optimizer (runtime/engine/engine_experts.h), in the same norm; their stages save
// DeepSpeed's PipelineEngine MoE layout (pipe/pipeline_checkpoint.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/ops/deferred_grads.h"
#include "dscpp/pipe/activation_meta.h"
#include "dscpp/pipe/pipeline_module.h"
#include "dscpp/pipe/schedule.h"
#include "dscpp/runtime/engine/engine_core.h"

namespace dscpp::pipe {

class TiedGrads;

// One micro-batch as the data iterator gives it: inputs (read on the first stage) and labels
// (read on the last).
struct MicroBatch {
  Activation inputs;
  at::Tensor labels;
};
using DataIter = std::function<MicroBatch()>;

// eval_batch's result, DeepSpeed's: the loss (averaged over micro-batches and data ranks with
// reduce_output "avg"; per micro-batch, [m], with "none"; undefined without compute_loss), on
// every stage; the last stage's outputs per micro-batch with return_logits.
struct EvalResult {
  at::Tensor loss;
  std::vector<Activation> outputs;
};

class PipelineEngine {
 public:
  PipelineEngine(PipelineModule module, const nlohmann::json& config, InitArgs args = {});
  ~PipelineEngine();

  // Pulls gradient_accumulation_steps micro-batches from data_iter on the first and last
  // stage (the others may pass nullptr), trains on them, steps, and returns the mean loss over
  // the micro-batches and data ranks, on every stage (a 0-dim float64 CPU tensor).
  at::Tensor train_batch(const DataIter& data_iter);
  EvalResult eval_batch(const DataIter& data_iter, bool compute_loss = true,
                        const std::string& reduce_output = "avg", bool return_logits = false);

  // DeepSpeed's PipelineEngine checkpoints (pipe/pipeline_checkpoint.cpp), collective over
  // every stage: layer_XX-model_states.pt per layer (data rank 0 of its stage), each stage's
  // mp_rank_<stage>_model_states.pt, the ZeRO partitions zero_pp_rank_D_mp_rank_<stage>, then
  // `latest`, each file renamed into place when complete. A load reads the whole checkpoint
  // and takes this rank's part, so it may have been saved on other numbers of stages and data
  // ranks and ZeRO stages 0-2 (the non-pipeline engine on the whole model loads one too);
  // load_checkpoint's switches are the plain engine's (LoadCheckpointOptions), strict.
  // A stage with expert parallelism writes no layer files: its module (less its experts) stays
  // in its model states and its experts go to layer_L_expert_E_mp_rank_<stage> files, as
  // DeepSpeed's; such a checkpoint loads at any expert-parallel degree too. With a model axis
  // each (stage, model rank) does so under its own mp_rank_<stage * t + model>, and the
  // checkpoint loads at any tensor degree and expert-parallel degree (ZeRO 0-2).
  void save_checkpoint(const std::string& save_dir, const std::string& tag = "",
                       const checkpoint::PyValue& client_state = checkpoint::PyValue::dict());
  LoadCheckpointResult load_checkpoint(const std::string& load_dir, const std::string& tag = "",
                                       bool load_optimizer_states = true,
                                       bool load_lr_scheduler_states = true,
                                       bool load_module_only = false);

  // Refused, as DeepSpeed's PipelineEngine does: a pipeline runs them inside train_batch.
  [[noreturn]] void forward();
  [[noreturn]] void backward();
  [[noreturn]] void step();

  bool is_first_stage() const { return module_.is_first_stage(); }
  bool is_last_stage() const { return module_.is_last_stage(); }
  int stage_id() const { return module_.stage_id(); }
  int num_stages() const { return module_.num_stages(); }
  int64_t global_steps() const { return core_->global_steps(); }
  int64_t gradient_accumulation_steps() const { return core_->gradient_accumulation_steps(); }
  int64_t train_micro_batch_size_per_gpu() const { return core_->train_micro_batch_size_per_gpu(); }
  int64_t train_batch_size() const { return core_->train_batch_size(); }
  double get_global_grad_norm() const { return core_->get_global_grad_norm(); }
  std::vector<double> get_lr() const { return core_->get_lr(); }
  double loss_scale() const { return core_->loss_scale(); }
  bool was_step_applied() const { return core_->was_step_applied(); }
  at::Device device() const { return core_->device(); }
  // The fraction of the last train_batch this stage spent outside forward and backward
  // (waiting on its neighbours, transfers, the step): the measured bubble.
  double last_bubble_fraction() const { return bubble_; }
  // The last train_batch's auxiliary losses (nn::add_aux_loss: the MoE layers' balancing
  // losses, as back-propagated, before the loss scale) of this stage's layers on this data
  // rank: their sum per micro-batch, averaged over the batch's micro-batches (a 0-dim float64
  // CPU tensor; 0 when its layers added none). The whole model's: the sum over the stages.
  at::Tensor last_aux_loss() const;
  PipelineModule& module() { return module_; }
  EngineCore& core() { return *core_; }

 private:
  // Per (chunk, micro-batch) while it is in flight on this stage.
  struct InFlight {
    Activation inputs;     // what the chunk's forward took (leaves where received)
    Activation outputs;    // what it gave (kept for its backward and its SendActivation)
    at::Tensor loss;       // the last virtual stage: the loss_fn's result
    at::Tensor aux;        // aux losses added by its layers (undefined: none)
    Activation in_grads;   // after backward: the gradients of the received inputs
    Activation out_grads;  // received gradients of outputs (a view of a grad buffer)
  };
  using Key = std::pair<int, int>;  // (chunk, micro_batch)
  struct Slots {                    // a chunk's receive buffers per slot, made from the agreed meta
    ActivationMeta meta;
    std::vector<Activation> buffers;
  };

  void run(const std::vector<Step>& steps, const DataIter& data_iter, bool training);
  void transfers(const Step& step, bool training);
  void load(const Instruction& in, const DataIter& data_iter);
  void forward_instruction(const Instruction& in, bool training);
  // Backward (split: B only, the parameters' gradients put off into deferred_) and W.
  void backward_instruction(const Instruction& in, bool split);
  void weight_instruction(const Instruction& in);
  // Once per engine: which matrices' gradients a split backward computed in B (layers that do
  // not split), on the stage's first data rank.
  void note_unsplit(const ops::DeferredGrads& deferred);
  bool last_virtual(int chunk) const;
  bool first_virtual(int chunk) const;
  Activation& slot(std::map<int, Slots>& slots, int chunk, int buffer, const ActivationMeta& meta,
                   bool grads_only);
  // The file layout save_checkpoint and load_checkpoint use (pipeline_checkpoint.cpp).
  CheckpointLayout checkpoint_layout();
  // The mean of `values` over data ranks, then from the last stage to all.
  at::Tensor share_from_last(at::Tensor values);
  // A loss's mean over the data ranks (in place; under DeepSpeed-Ulysses the sequence ranks'
  // shares summed first).
  void average_over_data_ranks(at::Tensor& t);
  // The last stage's: the batch's loss, the mean over its micro-batches and data ranks
  // (collective over the data group; a 0-dim float64 CPU tensor).
  at::Tensor mean_batch_loss();

  PipelineModule module_;
  std::shared_ptr<EngineCore> core_;
  std::unique_ptr<TiedGrads> tied_;
  PipeShape shape_;
  // This batch: loaded micro-batches, those in flight, the losses, the last backward.
  std::map<int, MicroBatch> loaded_;
  std::map<Key, InFlight> live_;
  std::map<Key, ops::DeferredGrads> deferred_;  // B's put-off gradients, until their W
  bool unsplit_noted_ = false;
  std::vector<at::Tensor> losses_;
  at::Tensor batch_loss_;  // the last stage's mean_batch_loss() of this train_batch
  std::vector<Activation> eval_outputs_;
  bool compute_loss_ = true, return_logits_ = false;
  Key last_backward_{-1, -1};
  std::map<int, bool> meta_sent_;          // per chunk: its outputs' meta went out this batch
  std::map<int, ActivationMeta> meta_in_;  // per chunk: the meta its inputs arrive with
  std::map<int, Slots> act_slots_, grad_slots_;
  double compute_ms_ = 0, bubble_ = 0;
  at::Tensor aux_sum_;  // this train_batch's aux losses so far, float64 on the device
};

}  // namespace dscpp::pipe

namespace dscpp {
// DeepSpeed's deepspeed.initialize(model=PipelineModule(...)): the pipeline engine. The
// config's pipeline.stages, when a number, must match the module's; ZeRO stage 3 is refused.
inline pipe::PipelineEngine initialize(pipe::PipelineModule module, const nlohmann::json& config,
                                       InitArgs args = {}) {
  return pipe::PipelineEngine(std::move(module), config, std::move(args));
}
}  // namespace dscpp
