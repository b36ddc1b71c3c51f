// EngineFlopsProfiler: what DeepSpeed's engine does with its flops_profiler section. At the
// global step `profile_step` (DeepSpeed's count: optimizer steps taken before it, from 0), on
// global rank 0 only, each micro-step's forward is profiled (FlopsProfiler, from a fresh
// count: the last micro-batch's is reported), that micro-step's forward, backward and the
// optimizer step are timed (each interval closed by a device synchronisation), and at the
// step's end the report (profile_report.h) goes to stdout, or to output_file (its folder
// made), under "Profile Summary at step <global_steps after the step>" as DeepSpeed prints it.
// Nothing happens when the section is off; the profiler's record-function callbacks exist
// only during the profiled forwards.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <string>

#include "dscpp/config/ds_config.h"
#include "dscpp/runtime/profiler/profile_report.h"

namespace dscpp::profiler {

class FlopsProfiler;

class EngineFlopsProfiler {
 public:
  EngineFlopsProfiler(const FlopsProfilerConfig& config, int64_t global_rank, at::Device device);
  ~EngineFlopsProfiler();

  // The engine's module (kept by the engine, outliving this); nullptr: nothing to profile.
  void set_module(const torch::nn::Module* module) { module_ = module; }

  void forward_begin(int64_t global_steps);
  void forward_end();
  void forward_failed();  // the forward threw: its counts are dropped
  void backward_begin();
  void backward_end();
  void step_begin();
  // After the optimizer step at the accumulation boundary; global_steps: counted with it.
  // sizes: the world, data- and model-parallel sizes and micro-batch (latencies are ours).
  void step_end(int64_t global_steps, EngineSummary sizes);

  // The last report written (empty before): for tests.
  const std::string& last_report() const { return last_report_; }

 private:
  FlopsProfilerConfig config_;
  bool on_;  // enabled, on global rank 0, with a module
  at::Device device_;
  const torch::nn::Module* module_ = nullptr;
  std::unique_ptr<FlopsProfiler> profiler_;
  bool profiled_ = false;  // a forward of this step was profiled
  bool in_backward_ = false, in_step_ = false;
  double fwd_ = 0, bwd_ = 0, step_ = 0, t0_ = 0;  // seconds
  std::string last_report_;
};

}  // namespace dscpp::profiler
