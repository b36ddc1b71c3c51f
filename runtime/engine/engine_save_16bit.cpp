// EngineCore::save_16bit_model: DeepSpeed's engine.save_16bit_model. The module's whole
// state_dict in its training dtype (16-bit under fp16/bf16), as one torch.save file that
// PyTorch and Hugging Face load directly. At stage 3 the parameters are gathered for it, and
// only when zero_optimization.stage3_gather_16bit_weights_on_model_save is on (gathering a
// whole model is expensive, so DeepSpeed makes it opt-in); otherwise nothing is written and
// the call returns false on every rank.
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "dscpp/runtime/checkpoint/torch_file.h"
#include "dscpp/runtime/engine/engine_core.h"
#include "dscpp/zero/gathered_parameters.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp {

using checkpoint::PyValue;

bool EngineCore::save_16bit_model(const std::string& save_dir, const std::string& save_filename) {
  const std::string path = (std::filesystem::path(save_dir) / save_filename).string();
  zero_->wait_all_published();
  if (zero_->stage() >= 3 && !config_.zero_optimization.stage3_gather_16bit_weights_on_model_save) {
    if (group_->rank() == 0)
      std::cerr << "dscpp: did not save the model " << path
                << " because zero_optimization.stage3_gather_16bit_weights_on_model_save is "
                   "false\n";
    return false;
  }
  at::NoGradGuard no_grad;
  std::string error;
  {
    // Collective at stage 3 (every rank gathers every partition); nothing at stages 0-2.
    const GatheredParameterSet gathered = gathered_whole();
    if (group_->rank() == 0) {
      try {
        // Parameters, then buffers, each under every name it has (a tied weight under both).
        PyValue sd = PyValue::ordered_dict();
        // Written before the scope releases them; the writer takes each to the CPU itself.
        for (const auto& [name, p] : named_params_()) sd.set(PyValue(name), PyValue(p.detach()));
        for (const auto& [name, b] : named_buffers_()) sd.set(PyValue(name), PyValue(b.detach()));
        std::filesystem::create_directories(save_dir);
        checkpoint::save_torch_file(sd, path);  // written beside, renamed into place
      } catch (const std::exception& e) {
        error = fmt::format("save_16bit_model '{}': {}", path, e.what());
      }
    }
  }
  agree(error, "save_16bit_model");
  return true;
}

}  // namespace dscpp
