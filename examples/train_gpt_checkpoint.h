// What train_gpt's loops (train_gpt.cpp's data / tensor parallel one and train_gpt_pipeline.cpp's)
// do alike around checkpoints: the client state a save writes beside the engine's, and the line a
// resumed run that has nothing left to train prints. One place, so that both layouts save and
// answer alike.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "dscpp/runtime/checkpoint/checkpoint_error.h"
#include "dscpp/runtime/checkpoint/torch_file.h"

namespace dscpp::examples {

// Megatron's names for where the run was (the engine's own counters restore it; these are for
// the tools that read Megatron-DeepSpeed checkpoints).
inline checkpoint::PyValue train_gpt_client_state(int64_t step, int64_t train_batch_size) {
  auto client = checkpoint::PyValue::dict();
  client.set("iteration", step);
  client.set("consumed_samples", step * train_batch_size);
  return client;
}

// --on-save-error: what a save that fails does to the run. The engine throws the same
// CheckpointError on every rank (the file and the cause named, no .tmp file left, `latest`
// still naming the last complete checkpoint), so every rank takes the same branch:
//   stop (the default): the run ends with this error, exit status 1, rather than train on
//     with nothing to resume from;
//   continue: rank 0 warns, training goes on, and the next save tries again.
// Runs `save` (the engine's save_checkpoint for `step`); returns whether it saved.
template <typename Save>
bool save_checkpoint_or(const Save& save, const std::string& on_save_error, int64_t step,
                        int rank) {
  try {
    save();
    return true;
  } catch (const checkpoint::CheckpointError& e) {
    if (on_save_error != "continue")
      throw std::runtime_error(
          fmt::format("stopping: the checkpoint of step {} was not saved: {} (with "
                      "--on-save-error continue, training would go on)",
                      step, e.what()));
    if (rank == 0)
      std::cerr << fmt::format(
                       "[train_gpt] warning: the checkpoint of step {} was not saved: {}; "
                       "training goes on (--on-save-error continue)\n",
                       step, e.what())
                << std::flush;
    return false;
  }
}

// A finished run resumed (the checkpoint at step `first` >= --train-iters): why nothing trains
// and what to raise, the ds_config's own schedule end included when it names one.
inline std::string finished_line(int64_t first, int64_t train_iters,
                                 const nlohmann::json& ds_config) {
  std::string line = fmt::format(
      "[train_gpt] finished: the checkpoint is at step {} and --train-iters is {}, so "
      "there is nothing left to train. To train further, raise --train-iters (e.g. "
      "--train-iters {})",
      first, train_iters, first + std::max<int64_t>(train_iters, 1));
  const auto sched = ds_config.find("scheduler");
  if (sched != ds_config.end() && sched->is_object() && sched->contains("params") &&
      (*sched)["params"].is_object() && (*sched)["params"].contains("total_num_steps"))
    line += fmt::format(
        "; the LR schedule ends at total_num_steps={} too: raise it in the ds_config (or "
        "write \"auto\" there, which --train-iters fills)",
        (*sched)["params"]["total_num_steps"].dump());
  return line + "\n";
}

}  // namespace dscpp::examples
