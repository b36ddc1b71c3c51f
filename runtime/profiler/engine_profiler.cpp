// EngineFlopsProfiler: see engine_profiler.h.
#include "dscpp/runtime/profiler/engine_profiler.h"

#include <filesystem>
#include <fstream>
#include <iostream>

#include "dscpp/error.h"
#include "dscpp/runtime/profiler/flops_profiler.h"

namespace dscpp::profiler {

EngineFlopsProfiler::EngineFlopsProfiler(const FlopsProfilerConfig& config, int64_t global_rank,
                                         at::Device device)
    : config_(config), on_(config.enabled && global_rank == 0), device_(device) {}

EngineFlopsProfiler::~EngineFlopsProfiler() = default;

void EngineFlopsProfiler::forward_begin(int64_t global_steps) {
  if (!on_ || !module_ || global_steps != config_.profile_step) return;
  // The tree is taken at the first profiled forward: by then the engine has cast and laid out
  // the module's parameters, which the tree maps to their modules.
  if (!profiler_) profiler_ = std::make_unique<FlopsProfiler>(*module_, device_);
  t0_ = FlopsProfiler::synchronized_now(device_);
  profiler_->start_profile();
}

void EngineFlopsProfiler::forward_end() {
  if (!profiler_ || !profiler_->started()) return;
  profiler_->stop_profile();
  fwd_ = FlopsProfiler::synchronized_now(device_) - t0_;
  profiled_ = true;
}

void EngineFlopsProfiler::forward_failed() {
  if (profiler_ && profiler_->started()) profiler_->stop_profile();
}

void EngineFlopsProfiler::backward_begin() {
  if (!profiled_) return;
  in_backward_ = true;
  t0_ = FlopsProfiler::synchronized_now(device_);
}

void EngineFlopsProfiler::backward_end() {
  if (!in_backward_) return;
  in_backward_ = false;
  bwd_ = FlopsProfiler::synchronized_now(device_) - t0_;
}

void EngineFlopsProfiler::step_begin() {
  if (!profiled_) return;
  in_step_ = true;
  t0_ = FlopsProfiler::synchronized_now(device_);
}

void EngineFlopsProfiler::step_end(int64_t global_steps, EngineSummary sizes) {
  if (!in_step_) return;
  in_step_ = false;
  step_ = FlopsProfiler::synchronized_now(device_) - t0_;
  profiled_ = false;
  sizes.fwd_latency = fwd_;
  sizes.bwd_latency = bwd_;
  sizes.step_latency = step_;
  sizes.recompute_fwd_factor = config_.recompute_fwd_factor;
  ReportOptions options;
  options.profile_step = global_steps;
  options.module_depth = config_.module_depth;
  options.top_modules = config_.top_modules;
  options.detailed = config_.detailed;
  last_report_ = model_profile_report(profiler_->tree(), options, sizes);
  if (!config_.output_file || config_.output_file->empty()) {
    std::cout << last_report_ << std::flush;
    return;
  }
  const std::filesystem::path path = std::filesystem::absolute(*config_.output_file);
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  std::ofstream out(path, std::ios::trunc);
  out << last_report_;
  out.flush();
  if (!out)
    throw dscpp::Error("flops_profiler.output_file: cannot write the profile to '" + path.string() +
                       "'");
}

}  // namespace dscpp::profiler
