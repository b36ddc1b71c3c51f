// The model-parallel RNG tracker: named states swapped in and out of a default generator.
#include "dscpp/nn/rng_tracker.h"

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <fmt/format.h>

#include <mutex>

#include "dscpp/nn/tensor_parallel_mappings.h"

namespace dscpp::nn {

namespace {

at::Generator default_generator(c10::Device device) {
  return at::globalContext().defaultGenerator(device);
}

// The generator's state and its replacement, under its lock (other threads may draw).
at::Tensor get_state(c10::Device device) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_state(c10::Device device, const at::Tensor& state) {
  at::Generator gen = default_generator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

void RNGStatesTracker::reset(c10::Device device) {
  device_ = device;
  states_.clear();
  seeds_.clear();
}

std::map<std::string, at::Tensor> RNGStatesTracker::get_states() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, state] : states_) out[name] = state.clone();
  return out;
}

void RNGStatesTracker::set_states(const std::map<std::string, at::Tensor>& states) {
  states_.clear();
  for (const auto& [name, state] : states) states_[name] = state.clone();
}

void RNGStatesTracker::add(const std::string& name, uint64_t seed) {
  if (seeds_.count(seed))
    throw TensorParallelError(fmt::format("RNG tracker: seed {} already exists", seed));
  if (states_.count(name))
    throw TensorParallelError(fmt::format("RNG tracker: state '{}' already exists", name));
  const at::Tensor orig = get_state(device_);
  {
    at::Generator gen = default_generator(device_);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
    states_[name] = gen.get_state();
  }
  set_state(device_, orig);
  seeds_.insert(seed);
}

RNGStatesTracker::Fork RNGStatesTracker::fork(const std::string& name) {
  if (!states_.count(name))
    throw TensorParallelError(fmt::format(
        "RNG tracker: state '{}' is not added (model_parallel_cuda_manual_seed adds '{}')", name,
        kModelParallelRngTrackerName));
  return Fork(this, name);
}

RNGStatesTracker::Fork::Fork(RNGStatesTracker* tracker, std::string name)
    : tracker_(tracker), name_(std::move(name)) {
  saved_ = get_state(tracker_->device_);
  set_state(tracker_->device_, tracker_->states_.at(name_));
}

RNGStatesTracker::Fork::Fork(Fork&& other) noexcept
    : tracker_(other.tracker_), name_(std::move(other.name_)), saved_(std::move(other.saved_)) {
  other.tracker_ = nullptr;
}

RNGStatesTracker::Fork::~Fork() {
  if (!tracker_) return;
  // The named stream continues where this scope left it; the default one as it was.
  tracker_->states_[name_] = get_state(tracker_->device_);
  set_state(tracker_->device_, saved_);
}

RNGStatesTracker& get_cuda_rng_tracker() {
  static RNGStatesTracker tracker;
  return tracker;
}

void model_parallel_cuda_manual_seed(uint64_t seed, int tp_rank, c10::Device device) {
  // Megatron's numbers: the tensor-parallel seed is offset so that it never meets the
  // data-parallel one, and differs per tensor-parallel rank.
  const uint64_t tensor_model_parallel_seed = seed + 2718 + static_cast<uint64_t>(tp_rank);
  RNGStatesTracker& tracker = get_cuda_rng_tracker();
  tracker.reset(device);
  {
    at::Generator gen = default_generator(device);
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
  }
  tracker.add(kModelParallelRngTrackerName, tensor_model_parallel_seed);
}

}  // namespace dscpp::nn
