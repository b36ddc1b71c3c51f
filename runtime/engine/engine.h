// dscpp::initialize and Engine<M>: DeepSpeed's engine for any LibTorch module. Engine<M>
// keeps the module's own forward signature and hands everything else to EngineCore. M is a
// module holder (torch::nn::Linear, a TORCH_MODULE) or a std::shared_ptr of any
// torch::nn::Module. A training program needs nothing but this surface; core() is for
// tests and tools that inspect the engine's internals.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/config/json_text.h"
#include "dscpp/nn/layer_hooks.h"
#include "dscpp/nn/moe/expert_params.h"
#include "dscpp/nn/tensor_parallel_attr.h"
#include "dscpp/runtime/engine/engine_core.h"
#include "dscpp/runtime/engine/gathered_parameter_set.h"

namespace dscpp {

namespace engine_detail {
// The module a holder or a shared_ptr points at.
template <typename Holder>
auto* module_of(Holder& holder) {
  return holder.ptr().get();
}
template <typename M>
M* module_of(std::shared_ptr<M>& module) {
  return module.get();
}
}  // namespace engine_detail

template <typename ModuleHolder>
class Engine {
 public:
  Engine(ModuleHolder module, std::shared_ptr<EngineCore> core)
      : module_(std::move(module)), core_(std::move(core)) {}

  // The module's forward. When it throws, what the engine did for it (stage 3's gathers)
  // is undone before the exception goes on, so training continues as if it had not run.
  template <typename... Args>
  decltype(auto) forward(Args&&... args) {
    core_->check_deferred_error();
    core_->forward_begin();
    auto out = module_forward(std::forward<Args>(args)...);
    core_->forward_end();
    return out;
  }
  void backward(const at::Tensor& loss) {
    core_->check_deferred_error();
    core_->backward(loss);
  }
  void step() {
    core_->check_deferred_error();
    core_->step();
  }
  void train(bool on = true) { module_->train(on); }

  // DeepSpeed's checkpoint calls; every rank calls them (see EngineCore).
  void save_checkpoint(const std::string& save_dir, const std::string& tag = "",
                       const checkpoint::PyValue& client_state = checkpoint::PyValue::dict()) {
    core_->check_deferred_error();
    core_->save_checkpoint(save_dir, tag, client_state);
  }
  // DeepSpeed's load_checkpoint, its arguments in its order (LoadCheckpointOptions says
  // what each does).
  LoadCheckpointResult load_checkpoint(const std::string& load_dir, const std::string& tag = "",
                                       bool load_module_strict = true,
                                       bool load_optimizer_states = true,
                                       bool load_lr_scheduler_states = true,
                                       bool load_module_only = false) {
    core_->check_deferred_error();
    return core_->load_checkpoint(
        load_dir, tag,
        {load_module_strict, load_optimizer_states, load_lr_scheduler_states, load_module_only});
  }
  bool save_16bit_model(const std::string& save_dir,
                        const std::string& save_filename = "pytorch_model.bin") {
    core_->check_deferred_error();
    return core_->save_16bit_model(save_dir, save_filename);
  }

  // DeepSpeed's deepspeed.zero.GatheredParameters(params, modifier_rank) for this engine's
  // module: zero/gathered_parameters.h says what the scope does, gathered_parameter_set.h how
  // the engine's partitions share it. Collective.
  //   { auto g = engine.gathered_parameters({net->weight}, /*modifier_rank=*/0); ... }
  // A failure when the scope closes is thrown by this engine's next call.
  GatheredParameterSet gathered_parameters(std::vector<at::Tensor> params, int modifier_rank = -1) {
    core_->check_deferred_error();
    return core_->gathered_parameters(std::move(params), modifier_rank);
  }
  void eval() { module_->eval(); }
  ModuleHolder& module() { return module_; }

  bool is_gradient_accumulation_boundary() const {
    return core_->is_gradient_accumulation_boundary();
  }
  int64_t global_steps() const { return core_->global_steps(); }
  int64_t global_samples() const { return core_->global_samples(); }
  int64_t skipped_steps() const { return core_->skipped_steps(); }
  std::vector<double> get_lr() const { return core_->get_lr(); }
  double get_global_grad_norm() const { return core_->get_global_grad_norm(); }
  double loss_scale() const { return core_->loss_scale(); }
  bool was_step_applied() const { return core_->was_step_applied(); }
  int64_t train_micro_batch_size_per_gpu() const { return core_->train_micro_batch_size_per_gpu(); }
  int64_t train_batch_size() const { return core_->train_batch_size(); }
  int64_t gradient_accumulation_steps() const { return core_->gradient_accumulation_steps(); }
  int zero_optimization_stage() const { return core_->zero_optimization_stage(); }
  int local_rank() const { return core_->local_rank(); }
  int world_size() const { return core_->world_size(); }
  int global_rank() const { return core_->global_rank(); }
  at::Device device() const { return core_->device(); }
  at::ScalarType dtype() const { return core_->dtype(); }     // the training type
  const DSConfig& config() const { return core_->config(); }  // the resolved ds_config
  // The data-parallel group the engine averages over (DeepSpeed's data_parallel_group),
  // e.g. to average a logged loss across ranks.
  comm::ProcessGroup& data_parallel_group() { return core_->group(); }
  // Megatron's model-parallel group (InitArgs::model_group); null without tensor parallelism.
  const std::shared_ptr<comm::ProcessGroup>& model_parallel_group() const {
    return core_->model_group();
  }
  // The ds_config's tensorboard / csv_monitor: whether one is on (the same on every rank), and
  // a program's own events beside the engine's, e.g. {"Train/Samples/tokens_per_sec", v,
  // global_samples()}: rank 0 writes them, a no-op on the others and with no monitor on.
  bool monitor_enabled() const { return core_->monitor_enabled(); }
  void write_monitor_events(const std::vector<monitor::Event>& events) {
    core_->write_monitor_events(events);
  }
  // The engine's internals (ZeRO's state, the LR schedule): for tests and tools.
  EngineCore& core() { return *core_; }

 private:
  template <typename... Args>
  auto module_forward(Args&&... args) {
    try {
      return module_->forward(std::forward<Args>(args)...);
    } catch (...) {
      core_->forward_failed();
      throw;
    }
  }

  ModuleHolder module_;
  std::shared_ptr<EngineCore> core_;
};

// module: a LibTorch module holder (torch::nn::Linear, a TORCH_MODULE, ...) or a
// std::shared_ptr of any torch::nn::Module. config: a ds_config file path, JSON text, or
// parsed JSON.
template <typename ModuleHolder>
Engine<ModuleHolder> initialize(ModuleHolder module, const nlohmann::json& config,
                                InitArgs args = {}) {
  nlohmann::json cfg = config.is_string() ? config::read_config(config.get<std::string>()) : config;
  auto* impl = engine_detail::module_of(module);
  if (args.model_group && args.model_group->size() > 1 && !args.tensor_parallel)
    args.tensor_parallel = std::make_shared<const std::map<std::string, nn::TensorParallelAttr>>(
        nn::tensor_parallel_attributes(*impl));
  if (!args.expert_params)
    args.expert_params = std::make_shared<const std::map<std::string, nn::moe::ExpertParam>>(
        nn::moe::expert_parameters(*impl));
  auto core = std::make_shared<EngineCore>(cfg, std::move(args));
  core->attach([impl](at::ScalarType dtype, at::Device device) { impl->to(device, dtype); },
               [impl]() {
                 EngineCore::NamedParams out;
                 for (const auto& item : impl->named_parameters(/*recurse=*/true))
                   out.emplace_back(item.key(), item.value());
                 return out;
               },
               [impl]() {
                 EngineCore::NamedParams out;
                 for (const auto& item : impl->named_buffers(/*recurse=*/true))
                   out.emplace_back(item.key(), item.value());
                 return out;
               },
               dynamic_cast<nn::Layered*>(impl));
  core->set_module(impl);
  return Engine<ModuleHolder>(std::move(module), std::move(core));
}

}  // namespace dscpp
