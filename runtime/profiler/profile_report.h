// The text of DeepSpeed's print_model_profile, byte for byte in its layout: the summary (its
// labels padded to 70 columns, its units and its rounding: Python's round(x, 2) printed with
// :g), the "Aggregated Profile per GPU" (the top modules by params, MACs and forward latency
// at each depth, as Python dicts), and the "Detailed Profile per GPU" (the module tree as
// PyTorch's repr prints it, each module's params, MACs, latency and FLOPS in its line).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "dscpp/runtime/profiler/module_tree.h"

namespace dscpp::profiler {

// DeepSpeed's number_to_string and its unit wrappers (profiler.py), precision 2.
std::string number_to_string(double num);
std::string macs_to_string(double macs);         // "25.69 MMACs"
std::string flops_to_string(double flops);       // "190.82 MFLOPS"
std::string params_to_string(double params);     // "7.25 M", "1.31 B", "256"
std::string duration_to_string(double seconds);  // "270.57 ms"

// What DeepSpeed's engine adds to the summary; without it the report is the standalone
// profiler's (params, MACs, flops and forward latency only).
struct EngineSummary {
  int64_t world_size = 1, dp_size = 1, mp_size = 1;
  int64_t micro_batch_per_gpu = 1;
  double fwd_latency = 0, bwd_latency = 0, step_latency = 0;  // seconds
  double recompute_fwd_factor = 0;                            // bwd flops = (2 + this) * fwd flops
};

struct ReportOptions {
  int64_t profile_step = 1;   // printed in the title
  int64_t module_depth = -1;  // -1: every depth
  int64_t top_modules = 1;
  bool detailed = true;
};

std::string model_profile_report(const ModuleTree& tree, const ReportOptions& options,
                                 const std::optional<EngineSummary>& engine);

}  // namespace dscpp::profiler
