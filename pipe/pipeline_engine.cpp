// PipelineEngine: see pipeline_engine.h. The instructions' execution; the transfers are in
// pipeline_transfers.cpp.
#include "dscpp/pipe/pipeline_engine.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <iostream>

#include "dscpp/config/config_error.h"
#include "dscpp/config/json_text.h"
#include "dscpp/error.h"
#include "dscpp/nn/aux_loss.h"
#include "dscpp/nn/moe/expert_params.h"
#include "dscpp/nn/tensor_parallel_attr.h"
#include "dscpp/pipe/tied_grads.h"

namespace dscpp::pipe {

namespace {

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Activation to_device(const Activation& a, at::Device device) {
  Activation out;
  for (const auto& t : a) out.push_back(t.to(device));
  return out;
}

}  // namespace

PipelineEngine::PipelineEngine(PipelineModule module, const nlohmann::json& config, InitArgs args)
    : module_(std::move(module)) {
  nlohmann::json cfg = config.is_string() ? config::read_config(config.get<std::string>()) : config;
  if (args.group)
    throw Error(
        "initialize(PipelineModule): InitArgs::group is not taken: the engine reduces over "
        "each stage's data-parallel group, which the module's topology makes");
  args.group = module_.data_group();
  // The last stage holds the loss: its reporting rank writes the monitors and the progress line.
  args.holds_loss = module_.holds_loss();
  // Tensor parallelism: EngineCore's model group (runtime/engine/tensor_parallel_grads.h) counts
  // each split parameter on every model rank and a replica once, then sums over the model
  // group; the pipe sum below composes with it (the sums run over orthogonal axes).
  if (module_.model_parallel_size() > 1) {
    args.model_group = module_.model_group();
    args.tensor_parallel = std::make_shared<const std::map<std::string, nn::TensorParallelAttr>>(
        nn::tensor_parallel_attributes(*module_.stage_module()));
  }
  // Expert parallelism: the stage's expert parameters of ep_size > 1 (nn::moe::expert_parameters
  // on the stage module, whose names are its parameters') get EngineCore's expert optimizer over
  // the expert-data group, made from the MoE layers' expert-parallel groups inside this stage's
  // data group (engine_experts.h): DeepSpeed's groups, the expert axis splitting the data axis.
  // At ep_size 1 they stay out of the map, replicated like any parameter, so a pipeline
  // checkpoint keeps them in its layer files.
  if (!args.expert_params) {
    std::map<std::string, nn::moe::ExpertParam> split;
    for (auto& [name, e] : nn::moe::expert_parameters(*module_.stage_module()))
      if (e.ep_size > 1) split.emplace(name, std::move(e));
    args.expert_params =
        std::make_shared<const std::map<std::string, nn::moe::ExpertParam>>(std::move(split));
  }
  core_ = std::make_shared<EngineCore>(cfg, std::move(args));
  const DSConfig& c = core_->config();
  if (c.zero_optimization.stage == 3)
    throw ConfigError("zero_optimization.stage",
                      "3 with a pipeline is refused (as DeepSpeed refuses it): each stage holds "
                      "only its own layers already; use stage 0, 1 or 2 (stage 2 reduce-scatters "
                      "every micro-batch's gradients into the partition)");
  if (c.pipeline.stages != "auto" && std::stoi(c.pipeline.stages) != module_.num_stages())
    throw ConfigError("pipeline.stages", fmt::format("{} but the PipelineModule has {} stages",
                                                     c.pipeline.stages, module_.num_stages()));
  if (module_.num_chunks() > 1 && module_.num_stages() < 2 && !module_.options().v_shape())
    throw Error("PipelineModule: interleaved chunks need at least 2 stages");
  if (module_.holds_loss() && !module_.options().loss_fn())
    throw Error(
        "PipelineModule: the stage that computes the loss (the last; the first in a V) needs a "
        "loss_fn (PipelineOptions::loss_fn)");
  shape_.stages = module_.num_stages();
  shape_.stage = module_.stage_id();
  shape_.micro_batches = static_cast<int>(c.gradient_accumulation_steps);
  shape_.chunks = module_.num_chunks();
  try {
    shape_.kind = parse_schedule_kind(c.pipeline.schedule);
  } catch (const Error& e) {
    throw ConfigError("pipeline.schedule", e.what());
  }
  // ZB-V runs the chunks of a module placed in a V, and only ZB-V does.
  if (module_.options().v_shape() != (shape_.kind == ScheduleKind::kZeroBubbleV))
    throw ConfigError("pipeline.schedule",
                      module_.options().v_shape()
                          ? fmt::format("\"{}\", but the PipelineModule places its chunks in a V "
                                        "(PipelineOptions::v_shape), which only \"zb-v\" runs",
                                        c.pipeline.schedule)
                          : std::string("\"zb-v\" runs two chunks per stage placed in a V: build "
                                        "the PipelineModule with num_chunks(2).v_shape(true)"));
  try {
    (void)train_schedule(shape_);  // refuses a shape the schedule cannot run (the arithmetic)
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    if (shape_.kind == ScheduleKind::kAuto) throw;
    throw ConfigError("pipeline.schedule", e.what());
  }
  auto stage = module_.stage_module();
  // The norm over every stage: this rank's sum of squares, its tied copies taken out, summed
  // along the pipe before ZeRO sums it over the data ranks.
  core_->set_reduce_sumsq_across([this](at::Tensor& sumsq) {
    if (tied_ && !tied_->empty()) sumsq = sumsq - tied_->duplicate_sumsq().to(sumsq.options());
    if (module_.num_stages() > 1) module_.pipe_group()->all_reduce(sumsq).wait();
  });
  core_->attach([stage](at::ScalarType dtype, at::Device device) { stage->to(device, dtype); },
                [stage]() {
                  EngineCore::NamedParams out;
                  for (const auto& item : stage->named_parameters(/*recurse=*/true))
                    out.emplace_back(item.key(), item.value());
                  return out;
                },
                [stage]() {
                  EngineCore::NamedParams out;
                  for (const auto& item : stage->named_buffers(/*recurse=*/true))
                    out.emplace_back(item.key(), item.value());
                  return out;
                });
  core_->set_module(stage.get());
  // Tied weights are summed among their stages in the dense partition; one stepped by another
  // partition of the ZeRO set (Muon's matrices) would miss that sum.
  for (const auto& t : module_.tied())
    for (const auto& part : core_->zero_partitions())
      if (part.names && part.zero != &core_->zero_optimizer())
        for (const auto& name : *part.names)
          if (name.rfind(t.module_name + ".", 0) == 0)
            throw Error(fmt::format(
                "pipeline: the tied weight '{}' (key '{}') is stepped by the {} partition; "
                "weights tied across stages must be in the dense one (InitArgs::use_muon "
                "false for it)",
                name, t.key, part.name));
  tied_ = std::make_unique<TiedGrads>(module_, core_->zero_optimizer());
  core_->set_checkpoint_layout(checkpoint_layout());
}

PipelineEngine::~PipelineEngine() = default;

void PipelineEngine::forward() {
  throw Error(
      "PipelineEngine: forward() is not available: a pipeline runs forward, backward and step "
      "inside train_batch(data_iter) (eval_batch for evaluation), as DeepSpeed's does");
}
void PipelineEngine::backward() {
  throw Error(
      "PipelineEngine: backward() is not available: a pipeline runs backward inside "
      "train_batch(data_iter), as DeepSpeed's does");
}
void PipelineEngine::step() {
  throw Error(
      "PipelineEngine: step() is not available: train_batch(data_iter) steps at the end of "
      "the batch, as DeepSpeed's does");
}

bool PipelineEngine::first_virtual(int chunk) const {
  return module_.virtual_stage(chunk) == 0;
}
bool PipelineEngine::last_virtual(int chunk) const {
  return module_.virtual_stage(chunk) == module_.num_stages() * module_.num_chunks() - 1;
}

at::Tensor PipelineEngine::train_batch(const DataIter& data_iter) {
  core_->check_deferred_error();
  module_.stage_module()->train();
  const auto steps = train_schedule(shape_);
  // Stages 0-1 reduce in the stage's last backward of the batch.
  for (const auto& step : steps)
    for (const auto& in : step)
      if (in.op == Op::kBackward || in.op == Op::kBackwardWeight)
        last_backward_ = {in.chunk, in.micro_batch};
  const double t0 = now_ms();
  compute_ms_ = 0;
  aux_sum_ = at::Tensor();
  run(steps, data_iter, /*training=*/true);
  const double wall = now_ms() - t0;
  bubble_ = wall > 0 ? std::max(0.0, 1.0 - compute_ms_ / wall) : 0.0;
  // The last stage's mean over micro-batches and data ranks, taken before the optimizer step
  // (for the monitors); then from the last stage to all.
  at::Tensor mean = module_.holds_loss() ? batch_loss_ : at::zeros({}, at::kDouble);
  batch_loss_ = at::Tensor();
  losses_.clear();
  at::Tensor t = mean.to(core_->device());
  if (module_.num_stages() > 1) module_.pipe_group()->broadcast(t, module_.loss_stage()).wait();
  return t.to(at::kCPU);
}

at::Tensor PipelineEngine::mean_batch_loss() {
  at::Tensor sum = at::zeros({}, at::kDouble);
  for (const auto& l : losses_) sum += l.to(at::kCPU, at::kDouble);
  at::Tensor mean = (sum / static_cast<double>(losses_.size())).to(core_->device());
  average_over_data_ranks(mean);
  return mean.to(at::kCPU);
}

at::Tensor PipelineEngine::last_aux_loss() const {
  if (!aux_sum_.defined()) return at::zeros({}, at::kDouble);
  return aux_sum_.to(at::kCPU) / static_cast<double>(shape_.micro_batches);
}

EvalResult PipelineEngine::eval_batch(const DataIter& data_iter, bool compute_loss,
                                      const std::string& reduce_output, bool return_logits) {
  core_->check_deferred_error();
  if (reduce_output != "avg" && reduce_output != "none")
    throw Error(
        fmt::format("eval_batch: reduce_output '{}': expected \"avg\" or \"none\"", reduce_output));
  module_.stage_module()->eval();
  compute_loss_ = compute_loss;
  return_logits_ = return_logits;
  {
    at::NoGradGuard no_grad;
    run(inference_schedule(shape_), data_iter, /*training=*/false);
  }
  compute_loss_ = true;
  module_.stage_module()->train();
  EvalResult result;
  result.outputs = std::move(eval_outputs_);
  eval_outputs_.clear();
  if (compute_loss) {
    const int m = shape_.micro_batches;
    at::Tensor per = at::zeros({m}, at::kDouble);
    if (module_.holds_loss())
      for (int i = 0; i < m; ++i) per[i] = losses_.at(i).to(at::kCPU, at::kDouble);
    per = share_from_last(per);
    result.loss = reduce_output == "avg" ? per.mean() : per;
  }
  losses_.clear();
  return result;
}

void PipelineEngine::average_over_data_ranks(at::Tensor& t) {
  if (module_.data_parallel_size() <= 1) return;
  // With DeepSpeed-Ulysses (the ds_config's sequence_parallel_size) the data group holds each
  // data rank's sequence ranks, whose losses are shares of their sequences' (they sum to it):
  // the sum over the group, over the data ranks alone, as the gradients are averaged.
  const int64_t sp = core_->config().sequence_parallel_size;
  if (sp <= 1) {
    module_.data_group()->all_reduce(t, comm::ReduceOp::kAvg).wait();
    return;
  }
  module_.data_group()->all_reduce(t, comm::ReduceOp::kSum).wait();
  t.div_(static_cast<double>(module_.data_parallel_size() / sp));
}

at::Tensor PipelineEngine::share_from_last(at::Tensor values) {
  at::Tensor t = values.to(core_->device());
  if (module_.holds_loss()) average_over_data_ranks(t);
  if (module_.num_stages() > 1) module_.pipe_group()->broadcast(t, module_.loss_stage()).wait();
  return t.to(at::kCPU);
}

void PipelineEngine::run(const std::vector<Step>& steps, const DataIter& data_iter, bool training) {
  loaded_.clear();
  live_.clear();
  deferred_.clear();
  losses_.clear();
  meta_sent_.clear();
  meta_in_.clear();
  try {
    for (const auto& step : steps) {
      transfers(step, training);
      for (const auto& in : step) {
        switch (in.op) {
          case Op::kLoadMicroBatch:
            load(in, data_iter);
            break;
          case Op::kForward:
            forward_instruction(in, training);
            break;
          case Op::kBackward:
            backward_instruction(in, /*split=*/false);
            break;
          case Op::kBackwardInput:
            backward_instruction(in, /*split=*/true);
            break;
          case Op::kBackwardWeight:
            weight_instruction(in);
            break;
          case Op::kReduceTiedGrads:
            tied_->all_reduce();
            break;
          case Op::kReduceGrads:
            break;  // done by ZeRO in the backwards (stages 0-1: the last one)
          case Op::kOptimizerStep:
            // Every forward has run: the batch's loss is known, and the monitors write it with
            // the step (the last stage's data ranks agree on it here).
            if (module_.holds_loss()) {
              batch_loss_ = mean_batch_loss();
              core_->set_step_loss(batch_loss_.item<double>());
            }
            // EngineCore counts micro-steps: the m-th is the boundary that steps.
            for (int i = 0; i < shape_.micro_batches; ++i) core_->step();
            break;
          default:
            break;  // transfers: done above
        }
      }
    }
  } catch (const std::exception& e) {
    // A failed stage leaves its peers' ranks to their timeouts; this engine cannot go on.
    core_->defer_error(fmt::format("pipeline stage {} failed: {}", module_.stage_id(), e.what()));
    live_.clear();
    deferred_.clear();
    throw Error(fmt::format("pipeline stage {} (data rank {}): {}", module_.stage_id(),
                            module_.data_parallel_id(), e.what()));
  }
  loaded_.clear();
  live_.clear();
}

void PipelineEngine::load(const Instruction& in, const DataIter& data_iter) {
  if (loaded_.count(in.micro_batch)) return;  // one stage both first and last
  if (!data_iter)
    throw Error(fmt::format("train_batch: stage {} loads micro-batches and has no data_iter",
                            module_.stage_id()));
  MicroBatch mb = data_iter();
  if (module_.is_first_stage() && mb.inputs.empty())
    throw Error(fmt::format("train_batch: micro-batch {} has no inputs", in.micro_batch));
  if (module_.holds_loss() && compute_loss_ && !mb.labels.defined())
    throw Error(fmt::format("train_batch: micro-batch {} has no labels", in.micro_batch));
  mb.inputs = to_device(mb.inputs, core_->device());
  if (mb.labels.defined()) mb.labels = mb.labels.to(core_->device());
  loaded_[in.micro_batch] = std::move(mb);
}

void PipelineEngine::forward_instruction(const Instruction& in, bool training) {
  const Key key{in.chunk, in.micro_batch};
  InFlight& f = live_[key];
  if (first_virtual(in.chunk)) {
    f.inputs = loaded_.at(in.micro_batch).inputs;
  } else {
    // The received buffer, as leaves of this stage's graph (sharing its storage: the slot is
    // not received into again before this micro-batch's gradient has gone back).
    const auto& meta = meta_in_.at(in.chunk);
    Activation& buf = act_slots_.at(in.chunk).buffers.at(in.buffer);
    f.inputs.clear();
    for (size_t i = 0; i < buf.size(); ++i) {
      at::Tensor x = buf[i].detach();
      if (training && meta[i].requires_grad) x.requires_grad_(true);
      f.inputs.push_back(x);
    }
  }
  const double t0 = now_ms();
  nn::AuxLossScope aux;
  Activation out = module_.forward_chunk(in.chunk, f.inputs);
  if (training) {
    f.aux = aux.sum();
    if (f.aux.defined()) {
      // Kept on the device: read by last_aux_loss() only when asked for.
      const at::Tensor a = f.aux.detach().to(at::kDouble);
      aux_sum_ = aux_sum_.defined() ? aux_sum_ + a : a;
    }
  }
  if (last_virtual(in.chunk)) {
    if (compute_loss_) {
      at::Tensor loss = module_.options().loss_fn()(out, loaded_.at(in.micro_batch).labels);
      losses_.push_back(loss.detach());
      if (training) f.loss = loss;
    }
    if (return_logits_ && !training) {
      Activation kept;
      for (const auto& t : out) kept.push_back(t.detach());
      eval_outputs_.push_back(std::move(kept));
    }
    loaded_.erase(in.micro_batch);
    if (!training) live_.erase(key);
  } else {
    f.outputs = std::move(out);
  }
  compute_ms_ += now_ms() - t0;
}

void PipelineEngine::backward_instruction(const Instruction& in, bool split) {
  const Key key{in.chunk, in.micro_batch};
  InFlight& f = live_.at(key);
  const double t0 = now_ms();
  // The loss a stage back-propagates is the batch's mean over micro-batches, scaled: the
  // last stage divides and scales; the gradients it sends back carry both.
  const double scale = core_->loss_scale() / static_cast<double>(shape_.micro_batches);
  std::vector<at::Tensor> outputs, grads;
  if (last_virtual(in.chunk)) {
    outputs.push_back(f.loss * scale);
    grads.push_back(at::ones_like(outputs.back()));
  } else {
    size_t g = 0;
    for (const auto& t : f.outputs) {
      if (!t.requires_grad()) continue;
      outputs.push_back(t);
      grads.push_back(f.out_grads.at(g++));
    }
  }
  if (f.aux.defined()) {
    outputs.push_back(f.aux * scale);
    grads.push_back(at::ones_like(outputs.back()));
  }
  if (split) {
    // B: the parameters' gradients go to the scope (products put off, the rest kept) and
    // reach ZeRO at this micro-batch's W; the received inputs' gradients land now.
    if (!outputs.empty()) {
      ops::DeferredGrads& deferred = deferred_[key];
      {
        ops::DeferGrads scope(deferred);
        torch::autograd::backward(outputs, grads);
      }
      note_unsplit(deferred);
    }
  } else if (!outputs.empty()) {
    core_->backward_from(outputs, grads, key == last_backward_);
  }
  if (!first_virtual(in.chunk)) {
    for (const auto& x : f.inputs) {
      if (!x.requires_grad()) continue;
      f.in_grads.push_back(x.grad().defined() ? x.grad() : at::zeros_like(x));
    }
  }
  f.outputs.clear();
  f.out_grads.clear();
  f.loss = at::Tensor();
  f.aux = at::Tensor();
  if (first_virtual(in.chunk)) live_.erase(key);
  compute_ms_ += now_ms() - t0;
}

void PipelineEngine::weight_instruction(const Instruction& in) {
  const Key key{in.chunk, in.micro_batch};
  auto it = deferred_.find(key);
  if (it == deferred_.end()) return;  // B had nothing to back-propagate
  ops::DeferredGrads deferred = std::move(it->second);
  deferred_.erase(it);
  const double t0 = now_ms();
  core_->backward_with([&] { deferred.run(); }, key == last_backward_);
  compute_ms_ += now_ms() - t0;
}

void PipelineEngine::note_unsplit(const ops::DeferredGrads& deferred) {
  if (unsplit_noted_) return;
  unsplit_noted_ = true;
  const std::vector<at::Tensor> unsplit = deferred.unsplit_matrices();
  if (unsplit.empty() || module_.data_parallel_id() != 0) return;
  std::vector<std::string> names;
  for (const auto& item : module_.stage_module()->named_parameters(/*recurse=*/true))
    for (const auto& t : unsplit)
      if (item.value().unsafeGetTensorImpl() == t.unsafeGetTensorImpl())
        names.push_back(item.key());
  std::cerr << fmt::format(
      "dscpp: pipeline stage {}: {}: the gradients of {} matrices are computed in B, not put off "
      "to W: their layers do not split their backward (ops/deferred_grads.h): {}\n",
      module_.stage_id(), to_string(shape_.kind), unsplit.size(), fmt::join(names, ", "));
}

}  // namespace dscpp::pipe
