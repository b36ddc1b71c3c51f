// train_gpt's log fields that every layout prints alike (train_gpt.cpp's data / tensor parallel
// loop and train_gpt_pipeline.cpp's): the start-up line's MoE parameter counts, the interval
// line's figures, the peak memory. One place, so that the lines tests and tools read keep one
// form whichever loop wrote them.
#pragma once

#include <c10/core/Device.h>
#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "dscpp/model_zoo/gpt_config.h"
#include "dscpp/runtime/monitor/peak_memory.h"

namespace dscpp::examples {

// Peak memory of this process: the CUDA caching allocator's peak on a GPU, the resident
// high-water mark (VmHWM) on the CPU.
inline std::string peak_memory(c10::Device device) {
  return fmt::format("{:.2f} GiB {} (peak)",
                     static_cast<double>(monitor::peak_memory_bytes(device)) / (1 << 30),
                     device.is_cuda() ? "allocated" : "resident");
}

// The start-up line's ", A M active (E experts top-k in N MoE layers)"; empty for a dense GPT.
inline std::string moe_parameter_fields(const model_zoo::GPTConfig& cfg) {
  if (!cfg.moe.enabled()) return "";
  return fmt::format(", {:.2f}M active ({} experts top-{} in {} MoE layers)",
                     cfg.active_parameters() / 1e6, cfg.moe.num_experts, cfg.moe.moe_router_topk,
                     cfg.moe.num_moe_layers());
}

// One log interval's figures.
struct IntervalFigures {
  int64_t step = 0, train_iters = 0;  // the last step done, of how many
  double loss = 0;                    // the mean over ranks, micro-batches and steps
  double lr = 0, grad_norm = 0, loss_scale = 0;
  double tokens_per_s = 0;  // the whole job's
  int64_t ranks = 1;        // what "per rank" divides by
  double tflops_per_rank = 0;
  double peak_tflops = 0;  // 0: unknown, MFU n/a
  bool moe = false;        // MFU of the active parameters
  std::string moe_fields;  // MoETraining::interval_report's (empty: dense)
};

// "step S/N | loss L | lr | grad norm | loss scale | T tokens/s (t per rank) | F TFLOP/s per rank
// | MFU M%[ (active parameters)][ | aux loss ... | load balance ...] | P GiB ... (peak)".
inline std::string interval_fields(const IntervalFigures& f, c10::Device device) {
  return fmt::format(
      "step {}/{} | loss {:.6f} | lr {:.3e} | grad norm {:.3f} | loss scale {:g} | {:.0f} tokens/s "
      "({:.0f} per rank) | {:.3f} TFLOP/s per rank | MFU {}{}{} | {}",
      f.step, f.train_iters, f.loss, f.lr, f.grad_norm, f.loss_scale, f.tokens_per_s,
      f.tokens_per_s / f.ranks, f.tflops_per_rank,
      f.peak_tflops > 0 ? fmt::format("{:.1f}%", 100 * f.tflops_per_rank / f.peak_tflops)
                        : std::string("n/a"),
      f.moe ? " (active parameters)" : "", f.moe_fields, peak_memory(device));
}

}  // namespace dscpp::examples
