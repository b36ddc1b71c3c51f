// Activation checkpointing, as DeepSpeed's deepspeed.checkpointing.checkpoint: a function's
// forward runs without keeping its intermediate activations, and backward runs it again from
// its saved inputs, with the CPU and accelerator random-number states of the first run and the
// model-parallel RNG tracker's states (nn/rng_tracker.h; so dropout, replicated or under the
// tracker's fork, draws the same masks), then back-propagates through the recomputed graph.
// Only the inputs stay alive between forward and backward, in page-locked host memory when
// cpu_checkpointing is on (copied there and back without waiting for the device).
//
// Like DeepSpeed's (and PyTorch's reentrant) checkpoint: parameters the function uses get
// their gradients during backward(); torch::autograd::grad() through a checkpoint is refused.
// Outside grad mode, or when no input requires grad, the function simply runs (with a
// warning in the second case: a checkpoint there would leave the parameters without grads).
//
// Auxiliary losses (nn/aux_loss.h, the MoE layers' balancing losses) survive the checkpoint:
// each run of the function has its own AuxLossScope, the first run's sum becomes one more
// output of the checkpoint, added to the caller's innermost scope, and backward
// back-propagates the recomputed run's sum with that output's gradient (the caller's loss
// scale, micro-batch division and all). So the side channel stays the one mechanism, for a
// training loop and the pipeline engine alike; Megatron's MoEAuxLossAutoScaler, which injects
// the aux gradient at the layer's output, would be a second one with its own loss scale.
// recomputing() says when a run is the recompute: what a layer counts once per forward (the
// router's expert-bias counts, training statistics) it skips then.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "dscpp/config/ds_config.h"

namespace dscpp::activation_checkpointing {

struct Options {
  bool cpu_checkpointing = false;  // saved inputs wait for backward in host memory (a no-op for
                                   // CPU tensors); off: they stay on their device
  bool synchronize = false;        // synchronize_checkpoint_boundary: wait for the device at each
                                   // checkpoint's start and end; off: no waits
  bool profile = false;  // print each checkpoint's forward and recompute+backward wall time
                         // to stderr; off: silent
};

// The options a ds_config's "activation_checkpointing" section asks for. Keys dscpp accepts
// but that change nothing here get a line in `notes` (when given): partition_activations
// (activations are partitioned over the model-parallel group, and dscpp's is always of size
// one, where DeepSpeed too keeps them whole) and contiguous_memory_optimization (not
// implemented: checkpoints are ordinary allocations). number_checkpoints is for the model
// to use (GPT: how many checkpointed segments its blocks form).
Options options_from_config(const ActivationCheckpointingConfig& section,
                            std::vector<std::string>* notes = nullptr);

using Function = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// fn(inputs), checkpointed. The outputs require grad when an input does (floating outputs
// only). `fn` must compute the same function of its inputs each time it is called, and is
// kept alive until backward.
std::vector<at::Tensor> checkpoint(Function fn, const std::vector<at::Tensor>& inputs,
                                   const Options& options = {});
// The one-tensor form every layer of a GPT has.
at::Tensor checkpoint(std::function<at::Tensor(const at::Tensor&)> fn, const at::Tensor& input,
                      const Options& options = {});

// True on this thread while backward recomputes a checkpointed function.
bool recomputing();

}  // namespace dscpp::activation_checkpointing
