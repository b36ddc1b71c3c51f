// FlopsProfiler: DeepSpeed's flops profiler (deepspeed/profiling/flops_profiler) for a
// LibTorch module. Between start_profile() and stop_profile() it counts the FLOPs and MACs of
// the operators actually run on the calling thread, from LibTorch's record-function callbacks
// with their input shapes (formulas: op_flops.h), and attributes each to a module:
//  - the innermost open module scope (nn::ModuleScope: the LayerModule's layers, model_zoo's
//    modules), the root module outside any;
//  - or, for an operator that takes a parameter, the module that registered it when that
//    module is the scope's child (through containers only): a torch::nn::LayerNorm or Linear
//    inside a scoped block gets its own counts without a scope of its own.
// An operator with a formula is counted as a whole and what it calls is skipped. Each module's
// forward time runs from its outermost scope's opening to its closing (a parameter-attributed
// module: its operators' time); on a CUDA device every such interval starts and ends with a
// device synchronisation, as DeepSpeed's hooks do. Only the forward is counted: stop before
// backward (DeepSpeed derives the backward's flops as 2x the forward's).
// One profiler per thread may be started at a time.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>

#include "dscpp/runtime/profiler/module_tree.h"

namespace dscpp::profiler {

class FlopsProfiler {
 public:
  // The module tree is taken now: modules registered later are not in the report.
  explicit FlopsProfiler(const torch::nn::Module& model, at::Device device = at::kCPU);
  ~FlopsProfiler();
  FlopsProfiler(const FlopsProfiler&) = delete;
  FlopsProfiler& operator=(const FlopsProfiler&) = delete;

  // Resets the counters and starts counting on this thread. Throws dscpp::Error when another
  // profiler is started on it.
  void start_profile();
  // Stops counting; the counts stay until the next start_profile.
  void stop_profile();
  bool started() const { return started_; }

  int64_t get_total_flops() const { return tree_.flops(0); }
  int64_t get_total_macs() const { return tree_.macs(0); }
  double get_total_duration() const { return tree_.duration(0); }  // seconds
  int64_t get_total_params() const { return tree_.node(0).params; }
  const ModuleTree& tree() const { return tree_; }
  ModuleTree& tree() { return tree_; }

  // Waits for the device's queued work (nothing on CPU), then reads a steady clock: seconds.
  static double synchronized_now(at::Device device);

  struct Observer;  // the record-function callbacks' side (flops_profiler.cpp)

 private:
  ModuleTree tree_;
  at::Device device_;
  bool started_ = false;
  uint64_t handle_ = 0;  // the thread-local callback's
  std::unique_ptr<Observer> observer_;
};

}  // namespace dscpp::profiler
