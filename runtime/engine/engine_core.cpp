// EngineCore: see engine_core.h.
#include "dscpp/runtime/engine/engine_core.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <iostream>
#include <map>
#include <set>

#include "dscpp/comm/launch_env.h"
#include "dscpp/comm/rendezvous.h"
#include "dscpp/config/config_error.h"
#include "dscpp/error.h"
#include "dscpp/nn/fp8_meta.h"
#include "dscpp/optim/lr_schedules.h"
#include "dscpp/optim/muon.h"
#include "dscpp/optim/optimizer.h"
#include "dscpp/runtime/engine/engine_experts.h"
#include "dscpp/runtime/engine/tensor_parallel_grads.h"
#include "dscpp/runtime/engine/universal_load.h"
#include "dscpp/runtime/engine/zero_options_from.h"
#include "dscpp/runtime/monitor/monitor.h"
#include "dscpp/runtime/monitor/peak_memory.h"
#include "dscpp/runtime/precision/loss_scaler.h"
#include "dscpp/runtime/profiler/engine_profiler.h"
#include "dscpp/zero/layer_gather.h"
#include "dscpp/zero/publish_waits.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp {

namespace {

// After its forward (no backward to follow) or its backward: a partition's parameters back to
// rest (stage 3; its layer hooks' end of step when it has them).
void release_after_use(ZeroPartition& p) {
  p.layer_gather ? p.layer_gather->end_step() : p.zero->release();
}

// Keys the config reader accepts whose mechanism the engine does not have yet: said once
// at start-up, never ignored silently.
std::vector<std::string> engine_gaps(const DSConfig& c) {
  std::vector<std::string> gaps;
  const auto& z = c.zero_optimization;
  // The optimizer's offload to the CPU or NVMe is acted on at stages 1-3 (zero/offload.h).
  if (z.offload_optimizer && z.offload_optimizer->device != "none" && z.stage == 0)
    gaps.push_back("'zero_optimization.offload_optimizer' (device " + z.offload_optimizer->device +
                   (z.stage == 0 ? ", at stage 0: offload needs ZeRO stage 1-3" : "") + ")");
  // The parameters' offload to the CPU or NVMe is acted on at stage 3 (zero/param_store.h,
  // zero/param_swap.h); the config reader announces it at stages 0-2.
  if (c.fp16.enabled && c.fp16.fp16_master_weights_and_grads)
    gaps.push_back("'fp16.fp16_master_weights_and_grads'");
  if (c.bf16.enabled && c.bf16.bf16_master_weights_and_grads)
    gaps.push_back("'bf16.bf16_master_weights_and_grads'");
  return gaps;
}

}  // namespace

EngineCore::EngineCore(const nlohmann::json& config, InitArgs args) {
  group_ = args.group ? args.group : comm::init_distributed();
  model_group_ = args.model_group;
  tp_attrs_ = args.tensor_parallel;
  if (model_group_ && model_group_->size() > 1 && !tp_attrs_)
    throw dscpp::Error(
        "initialize: a model-parallel group (InitArgs::model_group) needs the parameters' "
        "tensor-parallel attributes (InitArgs::tensor_parallel)");
  local_rank_ = comm::read_dist_env().local_rank;
  ConfigOptions options;
  options.world_size = group_->size();
  options.strict = args.strict_config;
  options.auto_values = args.auto_values;
  config_ = parse_ds_config(config, options);
  if (group_->rank() == 0) {
    for (const auto& w : config_.warnings) std::cerr << "dscpp: warning: " << w << "\n";
    for (const auto& i : config_.ignored) std::cerr << "dscpp: " << i << "\n";
    for (const auto& g : engine_gaps(config_))
      std::cerr << "dscpp: " << g << ": not implemented by the engine yet, ignored\n";
  }
  if (!config_.optimizer && !args.optimizer)
    throw ConfigError("optimizer",
                      "no optimizer: name one in the config, or pass a client optimizer "
                      "(InitArgs::optimizer)");
  if (config_.optimizer && args.optimizer)
    throw ConfigError("optimizer",
                      "both the config and the client (InitArgs::optimizer) give an optimizer: "
                      "keep one");
  client_.optimizer = std::move(args.optimizer);
  client_.param_groups = std::move(args.param_groups);
  client_.lr_scheduler = std::move(args.lr_scheduler);
  client_.expert_params = std::move(args.expert_params);
  client_.expert_data_group = std::move(args.expert_data_group);
  client_.use_muon = std::move(args.use_muon);
  dtype_ = config_.fp16.enabled ? at::kHalf : config_.bf16.enabled ? at::kBFloat16 : at::kFloat;
  if (group_->backend_name() == "nccl") device_ = at::Device(at::kCUDA, local_rank_);
  scaler_ = std::make_unique<LossScaler>(config_.fp16);
  // One reporting rank in the job: each data group's rank 0 would be one per stage and tensor
  // rank (each a file of its own, a stage without the loss writing 0). MonitorMaster opens
  // its files on its rank 0 alone: the reporter is that rank.
  reporter_ =
      args.holds_loss && group_->rank() == 0 && (!model_group_ || model_group_->rank() == 0);
  monitor_ = std::make_unique<monitor::MonitorMaster>(config_, reporter_ ? 0 : 1);
  flops_profiler_ = std::make_unique<profiler::EngineFlopsProfiler>(config_.flops_profiler,
                                                                    group_->rank(), device_);
}

void EngineCore::set_module(torch::nn::Module* module) {
  module_ = module;
  flops_profiler_->set_module(module);
}

EngineCore::~EngineCore() {
  // The module outlives the engine inside Engine<M>; its hooks must not outlive the coordinator.
  if (layered_) layered_->set_layer_hooks(nullptr);
}

std::vector<std::vector<int>> EngineCore::layer_param_indices() const {
  std::map<std::string, int> index;
  for (size_t i = 0; i < param_names_.size(); ++i) index[param_names_[i]] = static_cast<int>(i);
  for (const auto& [alias, name] : shared_params_) {
    auto it = index.find(name);
    if (it != index.end()) index[alias] = it->second;
  }
  std::vector<std::vector<int>> layers;
  for (const auto& names : layered_->layer_parameters()) {
    std::vector<int> ids;
    for (const auto& name : names) {
      auto it = index.find(name);
      if (it != index.end()) ids.push_back(it->second);  // frozen ones stay outside ZeRO
    }
    layers.push_back(std::move(ids));
  }
  return layers;
}

std::vector<int> EngineCore::layer_units(const std::vector<at::Tensor>& params,
                                         const ZeroSettings& settings) {
  std::vector<int> first_layer(params.size(), -1);
  const auto layers = layer_param_indices();
  for (int l = static_cast<int>(layers.size()) - 1; l >= 0; --l)
    for (int i : layers[l]) first_layer[i] = l;
  int64_t persisted = 0;
  std::vector<int> units;
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t n = params[i].numel();
    // Small parameters stay whole, as DeepSpeed decides it (at most the persistence threshold
    // each, the model persistence threshold together), and so does one that no layer names:
    // nothing would gather it.
    const bool small = n <= settings.param_persistence_threshold &&
                       persisted + n <= settings.model_persistence_threshold;
    if (small) persisted += n;
    units.push_back(small ? -1 : first_layer[i]);
  }
  return units;
}

std::vector<std::vector<int>> EngineCore::layer_buckets() const {
  const auto& layout = zero_->layout();
  std::vector<std::vector<int>> layers;
  for (const auto& ids : layer_param_indices()) {
    std::set<int> buckets;
    for (int i : ids) buckets.insert(layout.params[i].bucket);
    layers.emplace_back(buckets.begin(), buckets.end());
  }
  return layers;
}

void EngineCore::start_publish_waits() {
  publish_waits_ = std::make_unique<zero::PublishWaits>(*zero_, layer_buckets());
  layered_->set_layer_hooks(publish_waits_.get());
  zero_set_.front().publish_waits = publish_waits_.get();
}

void EngineCore::start_layer_gather(const zero::LayerGatherOptions& options) {
  const auto& layout = zero_->layout();
  for (size_t b = 0; b < layout.buckets.size(); ++b)
    if (layout.buckets[b].unit < 0) zero_->make_persistent(static_cast<int>(b));
  auto layer_buckets = this->layer_buckets();
  layer_gather_ = std::make_unique<zero::LayerGather>(*zero_, std::move(layer_buckets), options);
  layered_->set_layer_hooks(layer_gather_.get());
  zero_set_.front().layer_gather = layer_gather_.get();
}

void EngineCore::attach(const ModuleCast& cast, std::function<NamedParams()> named_params,
                        std::function<NamedParams()> named_buffers, nn::Layered* layered) {
  cast(dtype_, device_);
  named_params_ = std::move(named_params);
  named_buffers_ = std::move(named_buffers);
  std::vector<at::Tensor> params;
  // A parameter registered under two names (tied embeddings) is one tensor: it gets one
  // place in the flat buffer, and its other names are recorded as DeepSpeed's shared_params.
  std::map<const void*, std::string> seen;
  for (auto& [name, p] : named_params_()) {
    auto [it, fresh] = seen.emplace(p.unsafeGetTensorImpl(), name);
    if (!fresh) {
      shared_params_.emplace_back(name, it->second);
      continue;
    }
    if (!p.requires_grad()) continue;
    // Stage 3 leaves the module's own tensors empty (the engine holds the partitions): a module
    // whose stage-3 engine is gone, or still lives, has no values to train.
    if (p.numel() == 0)
      throw dscpp::Error(
          "initialize: parameter '" + name +
          "' has no elements. A module given to a ZeRO stage-3 engine keeps only empty tensors: "
          "its values live in the engine's partitions and go with it. Build the module again, "
          "or load a checkpoint into it; to keep the trained values, save them while the engine "
          "lives (save_16bit_model, or a checkpoint and zero_to_fp32)");
    params.push_back(p);
    param_names_.push_back(name);
  }
  const auto& z = config_.zero_optimization;
  // What the config decides (zero_options_from.h: each key once), then what the job adds.
  const ZeroSettings settings =
      zero_options_from(config_, {comm::read_dist_env().rank, device_.is_cuda()});
  zero::ZeroOptions zo = settings.zero;
  if (z.stage == 3 && layered) {
    layered_ = layered;
    zo.unit_of = layer_units(params, settings);
  } else if (zo.defer_allgather && layered) {
    layered_ = layered;  // its hooks wait for each layer's buckets (start_publish_waits)
  } else if (z.stage == 3 && group_->rank() == 0) {
    std::cerr << "dscpp: stage 3 gathers this module as a whole around its forward and "
                 "backward (give it as a LayerSpec list, nn::LayerModule, to gather layer "
                 "by layer); 'stage3_prefetch_bucket_size', 'stage3_max_live_parameters', "
                 "'stage3_max_reuse_distance' and 'stage3_param_persistence_threshold' have no "
                 "effect on it\n";
  }
  // The whole model's sum of squares, in one order: this rank's dense sum (ZeroOptimizer's),
  // every other partition's share, this rank's dense replicas taken out where it is not model
  // rank 0, the client's sum (a pipeline's stages), the model group's; then ZeroOptimizer sums
  // over the data group. The sums are over orthogonal axes; the local terms come first.
  zo.reduce_sumsq_across = [this, tp = tensor_parallel_size() > 1,
                            across = reduce_sumsq_across_](at::Tensor& sumsq) {
    for (size_t i = 1; i < zero_set_.size(); ++i) zero_set_[i].add_sumsq(sumsq);
    if (tp) sumsq = sumsq - tp_grads_->duplicate_sumsq().to(sumsq.options());
    if (across) across(sumsq);
    if (tp) model_group_->all_reduce(sumsq).wait();
  };
  // Parameter groups: each trainable parameter's group, by name.
  if (!client_.param_groups.empty()) {
    std::map<std::string, int> group_of_name;
    const int listed = static_cast<int>(client_.param_groups.size());
    for (int g = 0; g < listed; ++g) {
      for (const auto& name : client_.param_groups[g].params) {
        if (!group_of_name.emplace(name, g).second)
          throw dscpp::Error("initialize: parameter '" + name +
                             "' is in more than one parameter group");
      }
      zo.group_options.push_back(client_.param_groups[g].options);
    }
    bool unlisted = false;
    for (const auto& name : param_names_) {
      auto it = group_of_name.find(name);
      unlisted |= it == group_of_name.end();
      zo.group_of.push_back(it == group_of_name.end() ? listed : it->second);
      if (it != group_of_name.end()) group_of_name.erase(it);
    }
    if (!group_of_name.empty())
      throw dscpp::Error("initialize: parameter groups name '" + group_of_name.begin()->first +
                         "', which is not a trainable parameter of the module");
    if (unlisted) zo.group_options.push_back(nlohmann::json::object());
  }
  std::unique_ptr<optim::Optimizer> optimizer, muon;
  if (config_.optimizer && optim::is_muon(*config_.optimizer)) {
    // DeepSpeed's Muon: the auxiliary Adam steps the dense partition, Muon its own.
    optim::MuonHalves halves = optim::make_muon_halves(*config_.optimizer);
    optimizer = std::move(halves.adam);
    muon = std::move(halves.muon);
    // DeepSpeed's auxiliary Adam is its FusedAdam, which on the CPU accelerator is the CPU
    // Adam kernel: ours (ops/cpu_adam.h) where the shards are on the CPU.
    optimizer->set_cpu_kernels(true);
  } else {
    optimizer = config_.optimizer ? optim::make_optimizer(*config_.optimizer) : client_.optimizer();
  }
  if (!optimizer) throw dscpp::Error("initialize: the client optimizer factory gave null");
  if (zo.offload.enabled) {
    // ZeRO-Offload: the master and the optimizer state on the host, the CPU optimizer steps
    // them (DeepSpeed's DeepSpeedCPUAdam / CPUAdagrad / CPULion for Adam(W), Adagrad, Lion).
    optimizer->set_cpu_kernels(true);
    // The gradient partition on the host too, unless collectives run over it (a pipeline's
    // tied weights and norm, tensor parallelism's sequence-parallel sums): it is what lets
    // offload free the GPU's memory (4.64 B at stage 2: 17.3 GiB peak against 52 with the
    // partition on the device, docs/perf-log/2026-12-02.md), and the landing worker hides its
    // host work behind backward (docs/performance.md, "ZeRO-Offload").
    zo.offload.host_gradients = !reduce_sumsq_across_ && tensor_parallel_size() <= 1;
    // DeepSpeed's zero_force_ds_cpu_optimizer: an optimizer without a CPU implementation would
    // step the host partition with generic tensor ops, much slower; refused unless asked for.
    if (!optimizer->cpu_kernels() && config_.zero_force_ds_cpu_optimizer)
      throw ConfigError("zero_optimization.offload_optimizer",
                        "optimizer '" + optimizer->name() +
                            "' has no CPU implementation for ZeRO-Offload (Adam, AdamW, "
                            "Adagrad and Lion have): choose one of those, or set "
                            "\"zero_force_ds_cpu_optimizer\": false to step it with generic "
                            "tensor operations on the CPU");
  }
  take_experts(params, zo);  // (a no-op without expert parameters of ep_size > 1)
  if (muon) take_muon(params, zo, std::move(muon));
  auto* opt = optimizer.get();
  zero_ = std::make_unique<zero::ZeroOptimizer>(params, std::move(optimizer), group_, zo);
  ZeroPartition dense;
  dense.name = "dense";
  dense.zero = zero_.get();
  dense.group = group_.get();
  dense.names = &param_names_;
  dense.load_by_name = [this](const engine_checkpoint::WholeParams& whole, bool states) {
    // A tensor-parallel engine (plain or a pipeline's) cuts its shard of each split tensor.
    const int t = tensor_parallel_size();
    std::map<std::string, checkpoint::ParamPartition> parts;
    if (t > 1) parts = engine_checkpoint::partitions_of(tensor_parallel_info());
    engine_checkpoint::load_partition_by_name(*zero_, param_names_, whole, states,
                                              t > 1 ? &parts : nullptr, tensor_parallel_rank());
  };
  zero_set_.push_back(std::move(dense));
  add_expert_partition(zo, *opt);
  add_muon_partition();
  if (tensor_parallel_size() > 1) {
    std::vector<nn::TensorParallelAttr> attrs;
    for (const auto& name : param_names_) {
      auto it = tp_attrs_->find(name);
      if (it == tp_attrs_->end())
        throw dscpp::Error("initialize: parameter '" + name +
                           "' has no tensor-parallel attributes (InitArgs::tensor_parallel)");
      attrs.push_back(it->second);
    }
    tp_grads_ = std::make_unique<TensorParallelGrads>(*zero_, model_group_, std::move(attrs));
    zero_set_.front().tp_grads = tp_grads_.get();
    use_tensor_parallel_layout();  // a pipeline replaces it with its own
  }
  if (layered_) z.stage == 3 ? start_layer_gather(settings.layer_gather) : start_publish_waits();
  if (config_.scheduler) {
    scheduler_ = optim::make_scheduler(*config_.scheduler, *opt);
  } else if (client_.lr_scheduler) {
    scheduler_ = client_.lr_scheduler(*opt);
  }
  last_log_ = last_step_end_ = std::chrono::steady_clock::now();
}

zero::MemoryBreakdown EngineCore::memory_breakdown() const {
  if (zero_set_.empty()) return zero_->memory_breakdown();
  // Every partition's (dense, Muon's matrices, the experts'): describe() adds up equal names.
  zero::MemoryBreakdown out;
  for (const auto& p : zero_set_) {
    zero::MemoryBreakdown m = p.zero->memory_breakdown();
    out.insert(out.end(), m.begin(), m.end());
  }
  return out;
}

bool EngineCore::is_gradient_accumulation_boundary() const {
  return (micro_steps_ + 1) % config_.gradient_accumulation_steps == 0;
}

double EngineCore::get_global_grad_norm() const {
  return grad_norm_.defined() ? grad_norm_.item<double>() : 0.0;
}

double EngineCore::loss_scale() const {
  return scaler_->loss_scale();
}

std::vector<double> EngineCore::get_lr() const {
  std::vector<double> lrs;
  for (int g = 0; g < zero_->num_groups(); ++g) lrs.push_back(zero_->group_lr(g));
  return lrs;
}

double EngineCore::now_ms() {
  // A one-element copy to the host waits for the current stream: only paid when the user
  // asked for the breakdown.
  if (device_.is_cuda()) (void)at::zeros({1}, at::TensorOptions().device(device_)).cpu();
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void EngineCore::forward_begin() {
  if (config_.wall_clock_breakdown) forward_start_ = now_ms();
  for (auto& p : zero_set_) {
    if (p.zero->stage() == 3) {  // what forward_failed puts back to rest
      p.rest_before_forward.resize(p.zero->layout().buckets.size());
      for (size_t b = 0; b < p.rest_before_forward.size(); ++b)
        p.rest_before_forward[b] =
            p.zero->bucket_state(static_cast<int>(b)) == zero::ZeroOptimizer::BucketState::kRest;
    }
    // Stage 3 of a partition without layer hooks (a module without layers, the experts):
    // gathered as a whole for its forward and kept until its backward is done. Layer hooks
    // gather layer by layer (at stages 1-2 with deferred all-gathers, they wait for them layer
    // by layer; without, this waits for them all).
    if (!p.layer_gather && !p.publish_waits) p.zero->gather();
  }
  flops_profiler_->forward_begin(global_steps_);  // last: it times the module's forward
}

void EngineCore::forward_end() {
  for (auto& p : zero_set_) {
    // Parameters no layer named (and anything read after the forward) have arrived too.
    if (p.publish_waits) p.zero->wait_all_published();
    // A forward without autograd (evaluation) has no backward to wait for.
    if (!at::GradMode::is_enabled()) release_after_use(p);
  }
  if (config_.wall_clock_breakdown) timers_.forward += now_ms() - forward_start_;
  flops_profiler_->forward_end();
}

void EngineCore::forward_failed() {
  // Nothing else changed: counters move in backward and step, and the partial autograd
  // graph (its layer boundaries included) went with the exception. Only stage 3's gathers
  // outlive it: the whole module's (forward_begin), or the layers' (LayerGather's hooks).
  flops_profiler_->forward_failed();
  for (auto& p : zero_set_)
    for (size_t b = 0; b < p.rest_before_forward.size(); ++b)
      if (p.rest_before_forward[b]) p.zero->release_bucket(static_cast<int>(b));
}

void EngineCore::defer_error(const std::string& what) noexcept {
  if (deferred_) return;  // the first failure is the cause; later ones follow from it
  deferred_ = true;
  try {
    deferred_error_ = what;
  } catch (...) {  // no memory for the message: the flag alone still stops the engine
  }
}

void EngineCore::check_deferred_error() const {
  if (deferred_)
    throw Error("dscpp engine: " +
                (deferred_error_.empty() ? std::string("an earlier failure") : deferred_error_) +
                "; the ranks may no longer agree, so this engine cannot go on");
}

void EngineCore::backward(const at::Tensor& loss) {
  const bool timed = config_.wall_clock_breakdown;
  const double t0 = timed ? now_ms() : 0;
  flops_profiler_->backward_begin();
  const bool boundary = is_gradient_accumulation_boundary();
  // Stages 2-3 reduce every micro-step into the fp32 partition; stages 0 and 1 let the
  // gradients accumulate in the flat buffer and reduce once, at the boundary.
  for (auto& p : zero_set_) {
    if (boundary) p.zero->arm_overlapped_step(scaler_->loss_scale());
    p.zero->begin_backward(zero_optimization_stage() >= 2 || boundary);
  }
  if (monitor_->enabled() && reporter_) {
    at::Tensor l = loss.detach().to(at::kDouble);
    loss_sum_ = loss_sum_.defined() ? loss_sum_ + l : l;
  }
  at::Tensor scaled = loss;
  if (config_.gradient_accumulation_steps > 1)
    scaled = scaled / config_.gradient_accumulation_steps;
  if (scaler_->loss_scale() != 1.0) scaled = scaled * scaler_->loss_scale();
  scaled.backward();
  const double t1 = timed ? now_ms() : 0;
  end_backward_set();
  if (timed) {
    const double t2 = now_ms();
    timers_.backward += t2 - t0;
    timers_.backward_reduce += t2 - t1;
  }
  flops_profiler_->backward_end();
}

void EngineCore::backward_from(const std::vector<at::Tensor>& outputs,
                               const std::vector<at::Tensor>& grads, bool reduce) {
  backward_with([&] { torch::autograd::backward(outputs, grads); }, reduce);
}

void EngineCore::backward_with(const std::function<void()>& deliver, bool reduce) {
  const bool timed = config_.wall_clock_breakdown;
  const double t0 = timed ? now_ms() : 0;
  for (auto& p : zero_set_) p.zero->begin_backward(zero_optimization_stage() >= 2 || reduce);
  deliver();
  const double t1 = timed ? now_ms() : 0;
  end_backward_set();
  if (timed) {
    const double t2 = now_ms();
    timers_.backward += t2 - t0;
    timers_.backward_reduce += t2 - t1;
  }
}

void EngineCore::end_backward_set() {
  for (auto& p : zero_set_) p.zero->end_backward();
  // Stage 3: the gradients are reduced, the parameters go back to rest.
  for (auto& p : zero_set_) release_after_use(p);
}

zero::StepResult EngineCore::step_optimizers() {
  const double scale = scaler_->loss_scale();
  // The first partition's step works out the whole model's sum of squares (its
  // reduce_sumsq_across adds the others' shares); the others step with that same sum, in the
  // same units: one norm, one clip, one overflow verdict, one loss scale.
  zero::ZeroOptimizer& first = *zero_set_.front().zero;
  zero::StepResult r = first.step(scale);
  for (size_t i = 1; i < zero_set_.size(); ++i) {
    zero::ZeroOptimizer& z = *zero_set_[i].zero;
    if (z.deferred_scale() != first.deferred_scale())
      throw Error(std::string("engine: the ") + zero_set_[i].name + " and " +
                  zero_set_.front().name + " gradient partitions are averaged differently");
    // The LR schedule drives the first partition's optimizer; each other takes what it
    // follows of it.
    if (zero_set_[i].follow_schedule) zero_set_[i].follow_schedule(first.optimizer());
    z.step(scale, r.global_sumsq);
  }
  return r;
}

void EngineCore::publish_masters() {
  for (auto& p : zero_set_) p.zero->publish_master();
}

void EngineCore::refresh_masters_from_params() {
  for (auto& p : zero_set_) p.zero->refresh_master_from_params();
}

void EngineCore::step() {
  const bool boundary = is_gradient_accumulation_boundary();
  ++micro_steps_;
  samples_since_log_ += config_.train_micro_batch_size_per_gpu * group_->size();
  if (!boundary) return;
  const double t0 = config_.wall_clock_breakdown ? now_ms() : 0;
  flops_profiler_->step_begin();
  for (auto& p : zero_set_)
    if (p.tp_grads) p.tp_grads->all_reduce_sequence_parallel();  // before the norm reads them
  zero::StepResult r = step_optimizers();
  // FP8's delayed scales from this step's amaxes, alike on every data rank.
  if (module_)
    nn::update_fp8_metas(*module_, [this](at::Tensor& row) {
      if (group_->size() > 1) group_->all_reduce(row, comm::ReduceOp::kMax).wait();
    });
  if (config_.wall_clock_breakdown) timers_.step += now_ms() - t0;
  step_applied_ = r.applied;
  if (r.applied) grad_norm_ = r.grad_norm;
  if (scaler_->dynamic()) scaler_->update_scale(!r.applied);
  if (r.applied) {
    if (scheduler_) scheduler_->step();
  } else {
    ++skipped_steps_;
  }
  ++global_steps_;
  global_samples_ += config_.train_batch_size;
  // DeepSpeed's report of the profiled step (the world is the data-parallel group here).
  flops_profiler_->step_end(
      global_steps_, {group_->size(), group_->size(), 1, config_.train_micro_batch_size_per_gpu});
  if (monitor_->enabled() && reporter_) {
    // The mean of this rank's micro-batch losses of this step (one host sync, monitors only),
    // or the loss set_step_loss gave.
    double loss = has_step_loss_ ? step_loss_
                  : loss_sum_.defined()
                      ? loss_sum_.item<double>() / config_.gradient_accumulation_steps
                      : 0.0;
    loss_sum_ = at::Tensor();
    write_monitor_events(loss);
  }
  has_step_loss_ = false;
  if (config_.steps_per_print && *config_.steps_per_print > 0 &&
      global_steps_ % *config_.steps_per_print == 0)
    log_progress();
}

bool EngineCore::monitor_enabled() const {
  return monitor_->enabled();
}

void EngineCore::write_monitor_events(const std::vector<monitor::Event>& events) {
  if (monitor_->enabled() && reporter_) monitor_->write_events(events);
}

void EngineCore::write_monitor_events(double train_loss) {
  // DeepSpeed's event names, each at x = global_samples; then what our log line shows and
  // DeepSpeed's engine has no event for, under names of the same form.
  const int64_t x = global_samples_;
  const auto now = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(now - last_step_end_).count();
  last_step_end_ = now;
  std::vector<monitor::Event> events = {{"Train/Samples/train_loss", train_loss, x},
                                        {"Train/Samples/lr", zero_->optimizer().get_lr(), x}};
  if (config_.fp16.enabled)
    events.push_back({"Train/Samples/loss_scale", scaler_->loss_scale(), x});
  if (step_applied_) events.push_back({"Train/Samples/grad_norm", get_global_grad_norm(), x});
  // This step's throughput: the samples of one optimizer step over the time since the last.
  if (secs > 0)
    events.push_back({"Train/Samples/samples_per_sec", config_.train_batch_size / secs, x});
  events.push_back({"Train/Samples/peak_memory_gib",
                    static_cast<double>(monitor::peak_memory_bytes(device_)) / (1 << 30), x});
  if (config_.wall_clock_breakdown) {
    events.push_back({"Train/Samples/elapsed_time_ms_forward", timers_.forward, x});
    events.push_back({"Train/Samples/elapsed_time_ms_backward", timers_.backward, x});
    events.push_back({"Train/Samples/elapsed_time_ms_backward_inner",
                      timers_.backward - timers_.backward_reduce, x});
    events.push_back(
        {"Train/Samples/elapsed_time_ms_backward_allreduce", timers_.backward_reduce, x});
    events.push_back({"Train/Samples/elapsed_time_ms_step", timers_.step, x});
  }
  monitor_->write_events(events);
}

}  // namespace dscpp
