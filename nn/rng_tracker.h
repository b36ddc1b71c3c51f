// The model-parallel RNG tracker, as Megatron's CudaRNGStatesTracker / get_cuda_rng_tracker():
// named random-generator states beside the device's default generator. fork(name) swaps the
// named state into the default generator for a scope (so at::dropout, at::randn ... inside it
// draw from the named stream) and, leaving the scope, stores the advanced state back and
// restores the default generator as it was.
//
// model_parallel_cuda_manual_seed(seed, tp_rank) sets the layout Megatron uses: the default
// generator seeded with `seed` (the same on every tensor-parallel rank: dropout in replicated
// regions agrees across them), and the tracker's "model-parallel-rng" state seeded with
// seed + 2718 + tp_rank (dropout in split regions, drawn under fork(), differs across them).
// get_states / set_states copy the named states out and in, for checkpoints.
//
// A tracker works on one device's default generator: the CPU's, or a CUDA device's (any
// device LibTorch has a default generator for). Errors (a name or seed added twice, an
// unknown name) are TensorParallelError.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>

namespace dscpp::nn {

// Megatron's _MODEL_PARALLEL_RNG_TRACKER_NAME.
inline constexpr const char* kModelParallelRngTrackerName = "model-parallel-rng";

class RNGStatesTracker {
 public:
  explicit RNGStatesTracker(c10::Device device = c10::kCPU) : device_(device) {}

  // Forgets every state and seed; the tracker then works on `device`'s generator.
  void reset(c10::Device device);
  void reset() { reset(device_); }
  c10::Device device() const { return device_; }

  // A copy of the states (generator state byte tensors) by name, and back.
  std::map<std::string, at::Tensor> get_states() const;
  void set_states(const std::map<std::string, at::Tensor>& states);

  // A new named state: the default generator's state after seeding it with `seed` (the
  // default generator itself is left as it was).
  void add(const std::string& name, uint64_t seed);
  bool has(const std::string& name) const { return states_.count(name) > 0; }

  // The scope of a fork: while it lives, the default generator runs the named state.
  class Fork {
   public:
    Fork(Fork&& other) noexcept;
    Fork(const Fork&) = delete;
    Fork& operator=(const Fork&) = delete;
    Fork& operator=(Fork&&) = delete;
    ~Fork();

   private:
    friend class RNGStatesTracker;
    Fork(RNGStatesTracker* tracker, std::string name);
    RNGStatesTracker* tracker_;  // null once moved from
    std::string name_;
    at::Tensor saved_;  // the default generator's state before the fork
  };
  [[nodiscard]] Fork fork(const std::string& name = kModelParallelRngTrackerName);

 private:
  c10::Device device_;
  std::map<std::string, at::Tensor> states_;
  std::set<uint64_t> seeds_;
};

// The process's tracker (Megatron's get_cuda_rng_tracker()).
RNGStatesTracker& get_cuda_rng_tracker();

// Seeds `device`'s default generator with `seed` and resets the process's tracker onto that
// device with "model-parallel-rng" = seed + 2718 + tp_rank.
void model_parallel_cuda_manual_seed(uint64_t seed, int tp_rank, c10::Device device = c10::kCPU);

}  // namespace dscpp::nn
