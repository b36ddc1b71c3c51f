// checkpoint(): a C++ autograd Function that keeps a function's inputs (and random-number
// states) instead of its activations, and recomputes the activations in backward.
#include "dscpp/ops/autograd_function.h"  // first: see there

#include "dscpp/nn/activation_checkpointing.h"

#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/engine.h>

#include <chrono>
#include <iostream>
#include <map>
#include <mutex>
#include <utility>

#include "dscpp/error.h"
#include "dscpp/nn/aux_loss.h"
#include "dscpp/nn/rng_tracker.h"

namespace dscpp::activation_checkpointing {

namespace {

// Recomputes running on this thread (nested checkpoints recompute inside one another).
thread_local int recompute_depth = 0;

// cpu_checkpointing's copy of a saved input: into page-locked host memory (LibTorch's caching
// host allocator, whose blocks come back step after step) on the input's stream, without
// waiting for it; backward's copy back is queued the same way. The stream's order keeps the
// device memory of x from being reused before the copy has read it.
at::Tensor to_pinned_host(const at::Tensor& x) {
  at::Tensor host = at::empty(x.sizes(), x.options().device(at::kCPU).pinned_memory(true));
  host.copy_(x.detach(), /*non_blocking=*/true);
  return host;
}

struct Recomputing {
  Recomputing() { ++recompute_depth; }
  ~Recomputing() { --recompute_depth; }
  Recomputing(const Recomputing&) = delete;
  Recomputing& operator=(const Recomputing&) = delete;
};

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Random-number states of the CPU and of the accelerator devices a checkpoint may draw on, and
// the model-parallel RNG tracker's named states (dropout in a tensor-parallel region draws
// under its fork: Megatron's CheckpointFunction restores them too).
struct RngStates {
  at::Tensor cpu;
  std::vector<std::pair<at::Device, at::Tensor>> devices;
  std::map<std::string, at::Tensor> tracker;
};

at::Tensor get_rng_state(const at::Device& device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_rng_state(const at::Device& device, const at::Tensor& state) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// The accelerator's current device (a dropout there draws from its generator even when no
// input lives on it) and the devices of the inputs. None on a machine without accelerator
// devices, even where LibTorch was built for one (CUDA LibTorch without a driver).
std::vector<at::Device> rng_devices(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Device> out;
  auto type = at::accelerator::getAccelerator(/*checked=*/false);
  if (!type || at::accelerator::deviceCount() == 0) return out;
  auto add = [&](at::Device d) {
    for (const auto& seen : out)
      if (seen == d) return;
    out.push_back(d);
  };
  add(at::Device(*type, at::accelerator::getDeviceIndex()));
  for (const auto& t : inputs)
    if (t.defined() && t.device().type() == *type) add(t.device());
  return out;
}

RngStates capture(const std::vector<at::Device>& devices) {
  RngStates s;
  s.cpu = get_rng_state(at::Device(at::kCPU));
  for (const auto& d : devices) s.devices.emplace_back(d, get_rng_state(d));
  s.tracker = nn::get_cuda_rng_tracker().get_states();
  return s;
}

void restore(const RngStates& s) {
  set_rng_state(at::Device(at::kCPU), s.cpu);
  for (const auto& [device, state] : s.devices) set_rng_state(device, state);
  nn::get_cuda_rng_tracker().set_states(s.tracker);
}

void synchronize(const std::vector<at::Device>& devices) {
  for (const auto& d : devices) at::accelerator::synchronizeDevice(d.index());
}

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// What backward needs besides the saved inputs. A capsule carries it through the autograd
// context, whose saved_data holds only IValues.
struct State : torch::CustomClassHolder {
  Function fn;
  Options options;
  std::vector<at::Device> devices;       // accelerator devices whose RNG state is restored
  RngStates rng;                         // as the forward found them
  std::vector<bool> requires_grad;       // per input
  std::vector<bool> offloaded;           // per input: saved on the host by cpu_checkpointing
  std::vector<at::Device> input_device;  // per input: where backward puts it back
  bool has_aux = false;                  // the first run added aux losses: the last output
};

// fn(inputs) under its own AuxLossScope, the sum of the aux losses it added appended as the
// last output (the header says why). The recompute must add them as the first run did.
std::vector<at::Tensor> run_with_aux(State& state, const std::vector<at::Tensor>& inputs,
                                     bool recompute) {
  nn::AuxLossScope aux;
  std::vector<at::Tensor> outputs = state.fn(inputs);
  const bool has_aux = aux.sum().defined();
  if (!recompute)
    state.has_aux = has_aux;
  else if (has_aux != state.has_aux)
    throw Error(std::string("activation checkpointing: the recomputed function ") +
                (has_aux ? "added auxiliary losses its first run did not"
                         : "added no auxiliary loss where its first run did") +
                " (it must compute the same function each time)");
  if (has_aux) outputs.push_back(aux.sum());
  return outputs;
}

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // Runs in no-grad mode (Function::apply's guard): fn builds no graph and keeps nothing.
  // `inputs` as a TensorList: that is how Function::apply recognises a list of inputs.
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<State> state,
                               at::TensorList inputs) {
    const Options& o = state->options;
    if (o.synchronize) synchronize(state->devices);
    const double start = o.profile ? now_ms() : 0;
    state->rng = capture(state->devices);
    variable_list outputs = run_with_aux(*state, inputs.vec(), /*recompute=*/false);

    variable_list to_save;
    for (const auto& x : inputs) {
      state->requires_grad.push_back(x.defined() && x.requires_grad());
      state->input_device.push_back(x.defined() ? x.device() : at::Device(at::kCPU));
      const bool offload =
          o.cpu_checkpointing && x.defined() && !x.is_cpu() && x.is_floating_point();
      state->offloaded.push_back(offload);
      to_save.push_back(offload ? to_pinned_host(x) : x);
    }
    ctx->save_for_backward(to_save);
    ctx->saved_data["state"] = at::IValue::make_capsule(state);
    variable_list non_differentiable;
    for (const auto& y : outputs)
      if (y.defined() && !y.is_floating_point()) non_differentiable.push_back(y);
    ctx->mark_non_differentiable(non_differentiable);

    if (o.synchronize || o.profile) synchronize(state->devices);
    if (o.profile)
      std::cerr << fmt::format("dscpp: activation checkpoint forward: {:.3f} ms\n",
                               now_ms() - start);
    return outputs;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    // grad() computes only the requested gradients; the recompute's inner backward() would
    // accumulate into every parameter's .grad instead.
    TORCH_CHECK(torch::autograd::Engine::get_default_engine().is_checkpoint_valid(),
                "dscpp activation checkpointing works with backward() only, not "
                "torch::autograd::grad()");
    auto state = c10::static_intrusive_pointer_cast<State>(ctx->saved_data["state"].toCapsule());
    const Options& o = state->options;
    if (o.synchronize) synchronize(state->devices);
    const double start = o.profile ? now_ms() : 0;

    variable_list saved = ctx->get_saved_variables();
    variable_list inputs;
    for (size_t i = 0; i < saved.size(); ++i) {
      at::Tensor x = saved[i];
      if (!x.defined()) {
        inputs.push_back(x);
        continue;
      }
      if (state->offloaded[i]) x = x.to(state->input_device[i], /*non_blocking=*/true);
      x = x.detach();
      x.requires_grad_(state->requires_grad[i]);
      inputs.push_back(x);
    }

    variable_list outputs;
    {
      // The recompute draws what the forward drew; the RNG then continues where backward
      // found it, so code after the checkpoint sees the same stream with or without it.
      RngStates now = capture(state->devices);
      restore(state->rng);
      try {
        at::AutoGradMode grad_on(true);
        Recomputing recomputing;
        outputs = run_with_aux(*state, inputs, /*recompute=*/true);
      } catch (...) {
        restore(now);
        throw;
      }
      restore(now);
    }

    variable_list roots, root_grads;
    for (size_t i = 0; i < outputs.size() && i < grads.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grads[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grads[i]);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);

    variable_list result;
    result.emplace_back();  // for `state`, not a tensor
    for (const auto& x : inputs)
      result.push_back(x.defined() && x.requires_grad() ? x.grad() : at::Tensor());
    if (o.synchronize || o.profile) synchronize(state->devices);
    if (o.profile)
      std::cerr << fmt::format("dscpp: activation checkpoint recompute+backward: {:.3f} ms\n",
                               now_ms() - start);
    return result;
  }
};

}  // namespace

Options options_from_config(const ActivationCheckpointingConfig& section,
                            std::vector<std::string>* notes) {
  Options o;
  o.cpu_checkpointing = section.cpu_checkpointing;
  o.synchronize = section.synchronize_checkpoint_boundary;
  o.profile = section.profile;
  if (notes && section.partition_activations)
    notes->push_back(
        "activation_checkpointing.partition_activations: no effect in dscpp (it partitions "
        "over the model-parallel group, which is always of size one here; DeepSpeed too keeps "
        "checkpoints whole then)");
  if (notes && section.contiguous_memory_optimization)
    notes->push_back(
        "activation_checkpointing.contiguous_memory_optimization: not implemented by dscpp, "
        "ignored (checkpoints are ordinary allocations)");
  return o;
}

std::vector<at::Tensor> checkpoint(Function fn, const std::vector<at::Tensor>& inputs,
                                   const Options& options) {
  if (!at::GradMode::is_enabled()) return fn(inputs);
  bool any_requires_grad = false;
  for (const auto& x : inputs) any_requires_grad |= x.defined() && x.requires_grad();
  if (!any_requires_grad) {
    // The autograd node would not be recorded, and the parameters inside would get no
    // gradient; keeping the activations is the correct fallback.
    TORCH_WARN_ONCE(
        "dscpp checkpoint: no input requires grad, so the function runs without activation "
        "checkpointing");
    return fn(inputs);
  }
  auto state = c10::make_intrusive<State>();
  state->fn = std::move(fn);
  state->options = options;
  state->devices = rng_devices(inputs);
  std::vector<at::Tensor> outputs = CheckpointFunction::apply(state, at::TensorList(inputs));
  if (state->has_aux) {
    // The first run's aux losses, now an output with a gradient path into the recompute.
    nn::add_aux_loss(outputs.back());
    outputs.pop_back();
  }
  return outputs;
}

at::Tensor checkpoint(std::function<at::Tensor(const at::Tensor&)> fn, const at::Tensor& input,
                      const Options& options) {
  auto wrapped = [fn = std::move(fn)](const std::vector<at::Tensor>& in) {
    return std::vector<at::Tensor>{fn(in[0])};
  };
  return checkpoint(Function(std::move(wrapped)), std::vector<at::Tensor>{input}, options)[0];
}

bool recomputing() {
  return recompute_depth > 0;
}

}  // namespace dscpp::activation_checkpointing
