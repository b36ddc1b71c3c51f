// The engine's real work, independent of the user's module type: config, process group,
// precision, ZeRO, optimizer and LR schedule, the micro-step / boundary bookkeeping, and
// DeepSpeed's progress lines. Engine<M> (runtime/engine/engine.h) is a thin shell over it.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/config/ds_config.h"
#include "dscpp/runtime/checkpoint/torch_file.h"
#include "dscpp/runtime/engine/gathered_parameter_set.h"
#include "dscpp/runtime/monitor/event.h"
#include "dscpp/zero/memory_breakdown.h"

namespace torch::nn {
class Module;
}

namespace dscpp {

namespace optim {
class LRScheduler;
class Optimizer;
}  // namespace optim
namespace zero {
class ZeroOptimizer;
class LayerGather;
class PublishWaits;
struct ZeroOptions;
struct LayerGatherOptions;
struct StepResult;
}  // namespace zero
namespace nn {
class Layered;
struct TensorParallelAttr;
namespace moe {
struct ExpertParam;
}
}  // namespace nn
class LossScaler;
class EngineExperts;
struct ZeroSettings;
namespace engine_checkpoint {
struct WholeParams;
}
class TensorParallelGrads;
namespace monitor {
class MonitorMaster;
}
namespace profiler {
class EngineFlopsProfiler;
}

// One ZeRO partition of the engine's parameters (docs/architecture.md, "A set of partitions"):
// a ZeroOptimizer over its own process group, averaging its gradients by its own rule
// (ZeroOptions::average_over), and what the engine drives it with. The engine holds a set of
// them in a fixed order and loops over it for backward, the norm, the clip, the step, publishing
// and refreshing: the dense parameters first, over the data group (the LR schedule drives its
// optimizer, and its global sum of squares takes every other partition's share), then an MoE
// model's experts over the expert-data group (runtime/engine/engine_experts.h). A later group of
// parameters with its own process group is one more entry.
struct ZeroPartition {
  const char* name = "";                            // "dense", "experts": for errors
  zero::ZeroOptimizer* zero = nullptr;              // owned by the engine (dense) or what built it
  comm::ProcessGroup* group = nullptr;              // where it partitions and reduces
  const std::vector<std::string>* names = nullptr;  // its parameters' names, in its order
  // Its share of the whole model's sum of squares, added to the first partition's local sum
  // before that one's reductions; empty for the first.
  std::function<void(at::Tensor&)> add_sumsq;
  TensorParallelGrads* tp_grads = nullptr;  // its sequence-parallel sums at the step (null: none)
  // The layer hooks that gather it layer by layer (stage 3) or wait for its deferred all-gathers
  // layer by layer (stages 1-2); neither: gathered whole around forward and backward.
  zero::LayerGather* layer_gather = nullptr;
  zero::PublishWaits* publish_waits = nullptr;
  std::vector<char> rest_before_forward;  // stage 3: per bucket, at rest when forward began
  // Its parameters from the checkpoint's normal form (universal_load.h), cut as it holds them
  // (its tensor shards, its experts), with the optimizer states when `states`.
  std::function<void(const engine_checkpoint::WholeParams&, bool states)> load_by_name;
  // After the first partition's step, before its own: what it takes of the LR schedule's
  // settings (written into the first partition's optimizer); null: nothing.
  std::function<void(const optim::Optimizer& first)> follow_schedule;
};

// load_checkpoint's switches, DeepSpeed's names, order and defaults.
struct LoadCheckpointOptions {
  // false: the module's missing and unexpected keys are tolerated (PyTorch's strict=False):
  // a missing one keeps its value, an unexpected one is ignored; shapes must still agree.
  // Where ZeRO's parameters differ, the checkpoint's fp32 partitions and optimizer state
  // belong to another parameter set: they are not read (the fp32 master copy follows the
  // loaded module), so load_optimizer_states must be false or load_module_only true; at
  // stage 3, whose parameter values live only in those partitions, they must not differ.
  bool load_module_strict = true;
  bool load_optimizer_states = true;     // false: fresh optimizer state, fp32 weights still loaded
  bool load_lr_scheduler_states = true;  // false: the schedule keeps its current position
  bool load_module_only = false;         // true: the module's weights only, nothing else
};

// What load_checkpoint found: the tag folder it read and the client_state saved with it.
struct LoadCheckpointResult {
  std::string path;
  checkpoint::PyValue client_state = checkpoint::PyValue::dict();
  // With load_module_strict = false, the module's keys the checkpoint lacked (they kept
  // their values) and the checkpoint's keys the module lacks (ignored), as PyTorch's
  // load_state_dict returns them.
  std::vector<std::string> missing_keys, unexpected_keys;
};

// A parameter group (DeepSpeed's model_parameters as a list of dicts): parameters by their
// state_dict names, and optimizer settings over the config's ("lr", "weight_decay", ...).
struct ParamGroup {
  std::vector<std::string> params;
  nlohmann::json options = nlohmann::json::object();
};

// What initialize() takes besides the module and the config.
struct InitArgs {
  nlohmann::json auto_values = nlohmann::json::object();  // values for "auto" keys
  std::shared_ptr<comm::ProcessGroup> group;  // data-parallel group; default: init_distributed()
  // Tensor parallelism: this rank's model-parallel group (its t ranks at the same data index;
  // null or of size 1: none). ZeRO partitions and reduces over `group` only; the model group
  // sums the sequence-parallel gradients and the norm (runtime/engine/tensor_parallel_grads.h).
  std::shared_ptr<comm::ProcessGroup> model_group;
  // With a model group: every trainable parameter's partition attributes by state_dict name;
  // null: initialize() reads them from the module (nn::tensor_parallel_attributes).
  std::shared_ptr<const std::map<std::string, nn::TensorParallelAttr>> tensor_parallel;
  // Expert parallelism (runtime/engine/engine_experts.h): the expert parameters by state_dict
  // name; null: initialize() reads them from the module (nn::moe::expert_parameters). Those of
  // ep_size > 1 get their own ZeroOptimizer over the expert-data group.
  std::shared_ptr<const std::map<std::string, nn::moe::ExpertParam>> expert_params;
  // Their expert-data-parallel group (DeepSpeed's expert_data_parallel_group, of data / ep_size
  // ranks); null: made from the MoE layers' expert-parallel groups inside `group`.
  std::shared_ptr<comm::ProcessGroup> expert_data_group;
  bool strict_config = false;
  // With "type": "Muon": which parameters Muon steps, by state_dict name, over DeepSpeed's rule
  // (set_optimizer_flags: a matrix whose name holds neither "embed" nor "lm_head"), as
  // DeepSpeed's `param.use_muon`; the others take the auxiliary Adam.
  std::map<std::string, bool> use_muon;
  // Parameter groups; trainable parameters in none of them form one more group with the
  // config's settings. Empty: one group of every trainable parameter.
  std::vector<ParamGroup> param_groups;
  // A client optimizer (DeepSpeed's `optimizer=` argument): builds one on flat fp32 shards
  // (optim/optimizer.h), used when the config has no "optimizer" section (both: an error,
  // as in DeepSpeed). The engine registers its master partition with it.
  std::function<std::unique_ptr<optim::Optimizer>()> optimizer;
  // A client LR schedule (`lr_scheduler=`) over the engine's optimizer; a "scheduler" section
  // in the config takes precedence, as in DeepSpeed.
  std::function<std::unique_ptr<optim::LRScheduler>(optim::Optimizer&)> lr_scheduler;
  // Whether this engine holds the job's loss (a pipeline's: on its last stage only). One rank
  // of the job writes the monitors and prints the progress line: data rank 0 at model rank 0
  // of an engine that holds the loss.
  bool holds_loss = true;
};

// Where a checkpoint's files go and which ranks agree on a save or a load. The default is the
// plain engine's layout (runtime/checkpoint/ds_layout.h) agreed on group(); the pipeline engine
// (pipe/pipeline_checkpoint.cpp) names its files per stage and agrees over every stage.
struct CheckpointLayout {
  // Agreement, the tag check, the save id, `latest`'s writer (its rank 0); null: group().
  std::shared_ptr<comm::ProcessGroup> world;
  // This rank's model-states file (written by its group()'s rank 0) and ZeRO partition file;
  // null: ds_layout.h's.
  std::function<std::string(const std::string& dir, const std::string& tag)> model_states_path;
  std::function<std::string(const std::string& dir, const std::string& tag, int dp_rank, bool bf16)>
      zero_states_path;
  // On the rank that writes the model states, just before: more files (a pipeline's layer
  // files) and the keys describing them. Null: none.
  std::function<void(const std::string& dir, const std::string& tag,
                     checkpoint::PyValue& model_states)>
      before_model_states;
  // The engine holds a part of the model (a pipeline stage): a whole-model checkpoint's other
  // keys are not unexpected. stage / stages: this rank's place along the pipe, for the RNG
  // states of a pipeline checkpoint (restored when saved on the same layout).
  bool partial_module = false;
  int stage = 0, stages = 1;
  // DeepSpeed's checkpoint_mp_rank of this rank's MoE files (layer_L_expert_E_mp_rank_XX,
  // expp_rank_R_mp_rank_XX): a pipeline stage's pipe_mp_rank; 0 without a layout.
  int mp_rank = 0;
};

class EngineCore {
 public:
  // Moves the module to the training dtype and device.
  using ModuleCast = std::function<void(at::ScalarType, at::Device)>;
  using NamedParams = std::vector<std::pair<std::string, at::Tensor>>;

  EngineCore(const nlohmann::json& config, InitArgs args);
  ~EngineCore();
  // Second half of construction, once the module is known. named_params: every parameter
  // under its state_dict name (a shared one under each name); named_buffers likewise.
  // layered: the module's layer structure (a LayerModule), for stage 3 by layer; nullptr:
  // any other module, gathered as a whole at stage 3.
  void attach(const ModuleCast& cast, std::function<NamedParams()> named_params,
              std::function<NamedParams()> named_buffers, nn::Layered* layered = nullptr);
  // The engine's module (or a pipeline stage's), which outlives this core: the flops profiler
  // walks it (its tree, its parameters' owners), and the FP8 delayed-scaling state in it
  // (nn/fp8_meta.h) is updated after each optimizer step.
  void set_module(torch::nn::Module* module);

  // DeepSpeed's save_checkpoint / load_checkpoint (runtime/engine/engine_checkpoint.cpp):
  // collective, on every rank. tag "" means "global_step<N>" on save and <dir>/latest on
  // load. client_state: a dict saved beside the engine's own keys, returned by load.
  void save_checkpoint(const std::string& save_dir, const std::string& tag = "",
                       const checkpoint::PyValue& client_state = checkpoint::PyValue::dict());
  LoadCheckpointResult load_checkpoint(const std::string& load_dir, const std::string& tag = "",
                                       const LoadCheckpointOptions& options = {});
  // Before any save or load: where the files go (see CheckpointLayout).
  void set_checkpoint_layout(CheckpointLayout layout) { ckpt_layout_ = std::move(layout); }

  // DeepSpeed's save_16bit_model: the whole module's state_dict in the training dtype to
  // save_dir/save_filename, written by rank 0 (runtime/engine/engine_save_16bit.cpp). At stage
  // 3 only with stage3_gather_16bit_weights_on_model_save; false when nothing was written.
  // Collective.
  bool save_16bit_model(const std::string& save_dir,
                        const std::string& save_filename = "pytorch_model.bin");

  void backward(const at::Tensor& loss);
  // A pipeline stage's backward (pipe/pipeline_engine.h): from `outputs` with their received
  // gradients (undefined: ones, for a loss), already scaled by the caller; `reduce`: whether
  // stages 0-1 reduce this micro-batch's gradients (the stage's last backward of the batch).
  // Stages 2 reduce every one. Counts no micro-step (step() does).
  void backward_from(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& grads,
                     bool reduce);
  // The same around `deliver`, which hands the parameters a micro-batch's gradients put off
  // by a split backward (W of a zero-bubble schedule: ops/deferred_grads.h).
  void backward_with(const std::function<void()>& deliver, bool reduce);
  // Before attach(): ZeroOptions::reduce_sumsq_across (a pipeline's norm over its stages).
  void set_reduce_sumsq_across(std::function<void(at::Tensor&)> f) {
    reduce_sumsq_across_ = std::move(f);
  }
  void step();
  // Around the module's forward, for wall_clock_breakdown.
  void forward_begin();
  void forward_end();
  // Instead of forward_end when the module's forward threw: puts back to rest what this
  // forward gathered, so the engine is as if the forward had not been called.
  void forward_failed();

  // A failure that could not be thrown where it happened (a GatheredParameters scope's
  // destructor): kept, and thrown (as dscpp::Error) by every later engine call, since the
  // ranks may no longer agree. The first one is kept.
  void defer_error(const std::string& what) noexcept;
  void check_deferred_error() const;

  // Whether a tensorboard or csv_monitor is on (the same on every rank), and a program's own
  // events (train_gpt's tokens/s) into them beside the engine's: written by the one reporting
  // rank (InitArgs::holds_loss), a no-op elsewhere and with no monitor on.
  bool monitor_enabled() const;
  void write_monitor_events(const std::vector<monitor::Event>& events);
  // The train_loss the monitors write for the next optimizer step, in place of the mean of the
  // micro-batch losses backward() saw: a pipeline's, whose backward_from sees none (the
  // batch's mean over its micro-batches and data ranks).
  void set_step_loss(double loss) {
    step_loss_ = loss;
    has_step_loss_ = true;
  }

  bool is_gradient_accumulation_boundary() const;
  int64_t global_steps() const { return global_steps_; }
  int64_t global_samples() const { return global_samples_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  int64_t micro_steps() const { return micro_steps_; }
  std::vector<double> get_lr() const;
  // Waits for the last step's norm (kept on the device so the step itself does not wait).
  double get_global_grad_norm() const;
  // The same as the 0-dim float64 tensor, without waiting (on the device, or on the host where
  // the overflow check brought it there); undefined before the first applied step.
  const at::Tensor& global_grad_norm_tensor() const { return grad_norm_; }
  double loss_scale() const;
  bool was_step_applied() const { return step_applied_; }
  int64_t train_micro_batch_size_per_gpu() const { return config_.train_micro_batch_size_per_gpu; }
  int64_t train_batch_size() const { return config_.train_batch_size; }
  int64_t gradient_accumulation_steps() const { return config_.gradient_accumulation_steps; }
  int zero_optimization_stage() const { return config_.zero_optimization.stage; }
  int local_rank() const { return local_rank_; }
  int world_size() const { return group_->size(); }
  int global_rank() const { return group_->rank(); }
  at::Device device() const { return device_; }
  at::ScalarType dtype() const { return dtype_; }
  const DSConfig& config() const { return config_; }
  comm::ProcessGroup& group() { return *group_; }
  // Tensor parallelism (InitArgs::model_group): the model group (null: none), its size and
  // this rank's place in it (1 and 0 without), and each parameter's attributes by name.
  const std::shared_ptr<comm::ProcessGroup>& model_group() const { return model_group_; }
  int tensor_parallel_size() const { return model_group_ ? model_group_->size() : 1; }
  int tensor_parallel_rank() const { return model_group_ ? model_group_->rank() : 0; }
  // The partition metadata of every parameter ({tp_degree, data_parallel_size, partitions:
  // {name: dscpp_partition}}), what tensor-parallel checkpoints write (engine_checkpoint_tp.cpp).
  checkpoint::PyValue tensor_parallel_info();
  const std::shared_ptr<const std::map<std::string, nn::TensorParallelAttr>>&
  tensor_parallel_attributes() const {
    return tp_attrs_;
  }
  zero::ZeroOptimizer& zero_optimizer() { return *zero_; }
  // Engine::gathered_parameters' scope over the set (gathered_parameter_set.h), and every
  // partition's parameters gathered read only (the whole model: to save it). Collective.
  GatheredParameterSet gathered_parameters(std::vector<at::Tensor> params, int modifier_rank);
  GatheredParameterSet gathered_whole();
  // Expert parallelism (runtime/engine/engine_experts.h): the expert parameters' ZeroOptimizer
  // (over the expert-data group; null without expert parameters of ep_size > 1), that group
  // (null likewise), and the rest of what the engine knows of them (names, ep rank and size).
  zero::ZeroOptimizer* expert_zero_optimizer();
  const std::shared_ptr<comm::ProcessGroup>& expert_data_group() const;
  EngineExperts* experts() { return experts_.get(); }
  // The set of ZeRO partitions, dense first (see ZeroPartition).
  const std::vector<ZeroPartition>& zero_partitions() const { return zero_set_; }
  // The set in the order of a checkpoint's parameter groups, DeepSpeed's: Muon's matrices first
  // (its _muon_param_groups puts the Muon half before the Adam one), then the dense partition,
  // then the experts' (split_params_into_different_moe_groups_for_optimizer appends them).
  std::vector<const ZeroPartition*> checkpoint_partitions() const;
  // Every buffer the engine allocates for training, by name and where a GPU run keeps it
  // (ZeRO's parts: zero/memory_breakdown.h, zero_optimizer.h), at this moment.
  zero::MemoryBreakdown memory_breakdown() const;
  // Stage 3 by layer: the coordinator (nullptr otherwise).
  zero::LayerGather* layer_gather() { return layer_gather_.get(); }
  optim::LRScheduler* lr_scheduler() { return scheduler_.get(); }

 private:
  std::vector<std::vector<int>> layer_buckets() const;  // per layer, its parameters' buckets
  // Expert parallelism (engine_experts.cpp): takes the experts out of params (and zo's lists);
  // then, once the dense optimizer exists, adds theirs to the set (neither does anything
  // without expert parameters of ep_size > 1).
  void take_experts(std::vector<at::Tensor>& params, zero::ZeroOptions& zo);
  // "type": "Muon" (runtime/engine/engine_muon.cpp): the parameters Muon steps, taken out of
  // params / param_names_ into their own partition of the set, added after the dense one.
  void take_muon(std::vector<at::Tensor>& params, zero::ZeroOptions& zo,
                 std::unique_ptr<optim::Optimizer> muon);
  void add_muon_partition();
  // Refuses a save or load while a partition of the set is not checkpointed.
  void add_expert_partition(const zero::ZeroOptions& zo, const optim::Optimizer& dense);
  // The set's step: the first partition's, then the others' with its sum of squares.
  zero::StepResult step_optimizers();
  // Every partition's end of backward (the reductions), then its parameters back to rest.
  void end_backward_set();
  // Every partition's master copy into its parameters (after a load), or the other way.
  void publish_masters();
  void refresh_masters_from_params();
  void start_publish_waits();
  void log_progress();
  void write_monitor_events(double train_loss);
  std::chrono::steady_clock::time_point last_step_end_;  // for the samples/s event
  // Checkpoint parts (engine_checkpoint.cpp).
  checkpoint::PyValue model_states(const checkpoint::PyValue& client_state,
                                   checkpoint::PyValue rng_states);
  checkpoint::PyValue zero_states();  // collective at stages 1-2
  std::string shared_save_id();       // collective: rank 0's new save id
  checkpoint::PyValue gather_rng_states();
  void restore_rng_state(const checkpoint::PyValue& states);
  // This rank's saved model-parallel tracker states (null: none saved) into the process's
  // tracker (nn/rng_tracker.h).
  void restore_rng_tracker(const checkpoint::PyValue* saved);
  void check_tag_agrees(const std::string& tag);
  // The tag `latest` names; false (warning on rank 0, as DeepSpeed) when there is none.
  bool latest_tag(const std::string& load_dir, std::string* tag);
  // Returns whether ZeRO's parameters differ from the checkpoint's (load_module_strict false).
  bool load_module(const checkpoint::PyValue& model, const std::string& path,
                   const LoadCheckpointOptions& options, LoadCheckpointResult& result);
  void load_stage0_optimizer(const checkpoint::PyValue& model, const std::string& path,
                             bool load_optimizer_states);
  // settings (null: not wanted) receives the first partition file's optimizer_state_dict,
  // where DeepSpeed keeps its loss scaler (so that no file is read twice for it).
  void load_zero_partitions(const std::string& dir, const std::string& tag,
                            const checkpoint::PyValue& model, const std::string& model_path,
                            bool load_optimizer_states, checkpoint::PyValue* settings = nullptr);
  // Whether the checkpoint (rank 0's model states `model`, read from `path`) is laid out as
  // this engine's partitions: the plain engine's files at this ZeRO stage and expert-parallel
  // degree, so that each rank reads its own part (load_own_layout). Any other layout loads
  // through the checkpoint's normal form (load_normal_form).
  bool is_own_layout(const std::string& dir, const std::string& tag,
                     const checkpoint::PyValue& model, const std::string& path,
                     const LoadCheckpointOptions& options);
  // settings: the optimizer's settings it read on the way (DeepSpeed's loss scaler), or None.
  void load_own_layout(const std::string& dir, const std::string& tag, checkpoint::PyValue model,
                       const std::string& path, const LoadCheckpointOptions& options,
                       LoadCheckpointResult& result, checkpoint::PyValue& settings);
  // Every trainable parameter from `whole` into the set's partitions (this engine's tensor
  // shard and experts cut from them), and what ZeRO does not hold (buffers, frozen
  // parameters) by name from `module`, the one-rank model's state dict. No communication.
  void load_normal_form(const engine_checkpoint::WholeParams& whole,
                        const checkpoint::PyValue& module, const std::string& where,
                        const LoadCheckpointOptions& options);
  // This rank's random-number states where the checkpoint (rank 0's model states `model`)
  // was saved on this run's layout; None (saying so on rank 0) otherwise.
  checkpoint::PyValue rng_states_of(const std::string& dir, const std::string& tag,
                                    const checkpoint::PyValue& model, const std::string& path);
  // Tensor parallelism (engine_checkpoint_tp.cpp): Megatron-DeepSpeed's mp_rank_XX layout,
  // set by attach() with a model group; the partition metadata written into mp_rank_00.
  void use_tensor_parallel_layout();
  // Each partition not yet laid out (before the first backward) laid out in the order the
  // saving run's was (dscpp_layout_orders of this rank's model-states file; `model`, rank 0's,
  // read from `path`, where that is the one), where it recorded one for as many parameters;
  // else it keeps the guess. No communication.
  void lay_out_as_saved(const std::string& dir, const std::string& tag,
                        const checkpoint::PyValue& model, const std::string& path);
  // The engine's counters, schedule and loss scaler from a model-states file.
  void load_engine_counters(const checkpoint::PyValue& model, const std::string& path,
                            const LoadCheckpointOptions& options);
  comm::ProcessGroup& ckpt_group() { return ckpt_layout_.world ? *ckpt_layout_.world : *group_; }
  CheckpointLayout ckpt_layout_;
  // Throws on every rank when any rank's local_error is non-empty (after the same
  // collective on all), so one rank's failure never leaves the others waiting.
  void agree(const std::string& local_error, const char* what);
  // wall_clock_breakdown: milliseconds spent per phase since the last progress line.
  struct Timers {
    double forward = 0, backward = 0, backward_reduce = 0, step = 0;
  };
  double now_ms();  // waits for the device first, so GPU work is counted where it ran

  DSConfig config_;
  std::shared_ptr<comm::ProcessGroup> group_;
  int local_rank_ = 0;
  at::Device device_ = at::kCPU;
  at::ScalarType dtype_ = at::kFloat;
  std::unique_ptr<zero::ZeroOptimizer> zero_;
  std::unique_ptr<zero::LayerGather> layer_gather_;
  std::unique_ptr<zero::PublishWaits> publish_waits_;  // stages 1-2, deferred all-gathers
  nn::Layered* layered_ = nullptr;                     // whose hooks point at layer_gather_
  // Stage 3 by layer: the trainable parameters (indices into param_names_) each layer uses,
  // and each one's unit (the first layer using it; -1: persistent).
  std::vector<std::vector<int>> layer_param_indices() const;
  std::vector<int> layer_units(const std::vector<at::Tensor>& params, const ZeroSettings& settings);
  void start_layer_gather(const zero::LayerGatherOptions& options);
  std::unique_ptr<optim::LRScheduler> scheduler_;
  std::unique_ptr<LossScaler> scaler_;
  int64_t micro_steps_ = 0, global_steps_ = 0, global_samples_ = 0, skipped_steps_ = 0;
  at::Tensor grad_norm_;  // 0-dim, on the device; undefined before the first applied step
  bool step_applied_ = false;
  std::chrono::steady_clock::time_point last_log_;
  int64_t samples_since_log_ = 0;
  Timers timers_;
  InitArgs client_;  // the client optimizer and schedule factories, used by attach()
  std::unique_ptr<monitor::MonitorMaster> monitor_;                // tensorboard / csv_monitor
  std::unique_ptr<profiler::EngineFlopsProfiler> flops_profiler_;  // flops_profiler
  std::unique_ptr<zero::ZeroOptimizer> muon_zero_;      // "type": "Muon": the Muon half's partition
  std::vector<std::string> muon_names_;                 // its parameters' names
  std::unique_ptr<TensorParallelGrads> muon_tp_grads_;  // its replicas' share of the norm (TP)
  torch::nn::Module* module_ = nullptr;                 // set_module
  at::Tensor loss_sum_;   // this accumulation's micro-batch losses, while a monitor is on
  double step_loss_ = 0;  // set_step_loss's, while has_step_loss_
  bool has_step_loss_ = false;
  bool reporter_ = false;  // the rank that writes the monitors and the progress line
  std::function<NamedParams()> named_params_, named_buffers_;
  std::vector<std::string> param_names_;  // the trainable parameters, as the ZeRO buffer holds them
  std::vector<std::pair<std::string, std::string>> shared_params_;  // alias -> first name
  double forward_start_ = 0;
  bool deferred_ = false;                                 // see defer_error
  std::function<void(at::Tensor&)> reduce_sumsq_across_;  // set_reduce_sumsq_across
  std::shared_ptr<comm::ProcessGroup> model_group_;       // InitArgs::model_group
  std::shared_ptr<const std::map<std::string, nn::TensorParallelAttr>> tp_attrs_;
  std::unique_ptr<TensorParallelGrads> tp_grads_;  // with a model group of size > 1
  std::unique_ptr<EngineExperts> experts_;         // with expert parameters of ep_size > 1
  std::vector<ZeroPartition> zero_set_;            // zero_ first, then the experts' (if any)
  std::string deferred_error_;
};

}  // namespace dscpp
