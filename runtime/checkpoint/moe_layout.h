// DeepSpeed's MoE checkpoint layout (deepspeed/runtime/engine.py: _save_moe_checkpoint,
// _get_expert_ckpt_name, load_moe_state_dict, _get_non_moe_state_dict):
//   <dir>/<tag>/layer_<L>_expert_<E>_mp_rank_<XX>_model_states.pt   one GLOBAL expert E of MoE
//       layer L (DeepSpeed's moe_layer_id): that expert's tensors under the module's state_dict
//       names with the global id (`<moe>.deepspeed_moe.experts.deepspeed_experts.<E>.<rest>`);
//       written by the ranks of expert-data-parallel rank 0, each for its own local experts
//   <dir>/<tag>/mp_rank_<XX>_model_states.pt   `module` without the expert tensors, and
//       `num_experts` (a list, one count per MoE layer; DeepSpeed's old int form is refused)
// A stacked weight (GroupedMLP's weight1 [E_l, ...]) is cut per expert as DeepSpeed's AutoEP
// cuts its fused w1/w2/w3: `<moe>.deepspeed_moe.experts.weight1.<E>` = weight1[local], so each
// file still holds one expert, and a loader at any expert-parallel degree re-stacks its own.
// Pure file-name and key arithmetic plus reading/writing those files; CheckpointError on bad
// input, naming the file.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dscpp/nn/moe/expert_params.h"
#include "dscpp/runtime/checkpoint/torch_file.h"

namespace dscpp::checkpoint {

// "layer_0_expert_3_mp_rank_00_model_states.pt" under <dir>/<tag>/.
std::string expert_states_path(const std::string& dir, const std::string& tag, int layer,
                               int64_t global_expert, int mp_rank = 0);
// DeepSpeed's stage-0 MoE optimizer file, one per expert-parallel rank (its expert-data rank 0
// writes it): "expp_rank_<R>_mp_rank_00_optim_states.pt" holding {"optimizer": state_dict}.
std::string expp_optim_states_path(const std::string& dir, const std::string& tag, int expp_rank,
                                   int mp_rank = 0);

// One expert's share of a parameter: the global key it is saved under, its place.
struct ExpertSlot {
  int layer = 0;
  int64_t global_expert = 0;
  std::string key;     // DeepSpeed's per-expert state_dict key
  int64_t slice = -1;  // -1: the whole tensor (a clone's); else the index along dim 0
};
// The slots of an expert parameter `name` (a clone's: one; a stacked one's: E_l).
std::vector<ExpertSlot> expert_slots(const std::string& name, const nn::moe::ExpertParam& e);

// The MoE layers of an expert map: num_experts per layer (DeepSpeed's `num_experts`).
std::vector<int64_t> num_experts_per_layer(const std::map<std::string, nn::moe::ExpertParam>& ex);

// What the model-states file records beside DeepSpeed's keys (`dscpp_moe`): ep_size, and per
// expert parameter (local name) its layer, local expert (-1: stacked) and local count, so a
// reader knows the saved naming without the saving model.
PyValue moe_info(const std::map<std::string, nn::moe::ExpertParam>& experts);
// The expert-parallel degree a model-states file was saved at (its dscpp_moe's ep_size; 1
// without one).
int64_t moe_ep_size(const PyValue& model);
// The same read back (the ep_rank of each entry is 0: files are per global expert). A
// checkpoint without `dscpp_moe` is DeepSpeed's: its expert map cannot be named, so throws.
std::map<std::string, nn::moe::ExpertParam> experts_of_info(const PyValue& model,
                                                            const std::string& path);

// Writes this rank's local experts' files: per (layer, global expert) one OrderedDict of its
// tensors (cloned compact, `value(name)` giving each expert parameter's current value).
// mp_rank: DeepSpeed's checkpoint_mp_rank (a pipeline stage's: pipe_layout.h's pipe_mp_rank).
void save_expert_files(const std::string& dir, const std::string& tag,
                       const std::map<std::string, nn::moe::ExpertParam>& experts,
                       const std::function<at::Tensor(const std::string&)>& value, int mp_rank = 0);

// The expert map the one-rank model (ep 1) of a checkpoint saved with `saved` has: every global
// expert a local one (clones renamed deepspeed_experts.<E>, stacked weights [E, ...]).
std::map<std::string, nn::moe::ExpertParam> one_rank_experts(
    const std::map<std::string, nn::moe::ExpertParam>& saved);

// A state dict of the one-rank model of a MoE checkpoint (every global expert a local one:
// clones under deepspeed_experts.<E>, stacked weights [E, ...]; a pipeline's or a tensor
// rank's part read whole) as a model with expert map `experts` (any expert-parallel degree and
// rank) names it: the one-rank expert entries dropped, this model's local values added after the
// others. where: the checkpoint, for errors ("... holds no '<key>'").
PyValue module_at_experts(const PyValue& one_rank_module,
                          const std::map<std::string, nn::moe::ExpertParam>& experts,
                          const std::string& where);

class ExpertFiles;
// `module` (a state dict without expert tensors, as the model-states file keeps it) with the
// local value of every expert parameter of `experts` added, read from the expert files.
PyValue module_with_experts(const PyValue& module,
                            const std::map<std::string, nn::moe::ExpertParam>& experts,
                            ExpertFiles& files);

// Reads expert files on demand, each once; refusals name the folder and the file expected.
class ExpertFiles {
 public:
  // saved_num_experts: the checkpoint's `num_experts` (read from `model_path`); mp_rank: the
  // files' mp_rank_XX (a pipeline stage's, DeepSpeed's checkpoint_mp_rank).
  ExpertFiles(std::string dir, std::string tag, std::vector<int64_t> saved_num_experts,
              std::string model_path, int mp_rank = 0);
  static ExpertFiles of_model(const std::string& dir, const std::string& tag, const PyValue& model,
                              const std::string& model_path, int mp_rank = 0);
  // The tensor saved under a slot's key; missing file or key: CheckpointError.
  const at::Tensor& tensor(const ExpertSlot& slot);
  // This rank's local value of expert parameter `name` (clones: the file's tensor; stacked:
  // its experts' tensors stacked on dim 0), checked against the model's layer count.
  at::Tensor local_value(const std::string& name, const nn::moe::ExpertParam& e);
  // Refuses a model whose MoE layers or expert counts differ from the checkpoint's.
  void check_model(const std::map<std::string, nn::moe::ExpertParam>& experts) const;
  const std::vector<int64_t>& num_experts() const { return num_experts_; }

 private:
  std::string dir_, tag_, model_path_;
  std::vector<int64_t> num_experts_;
  int mp_rank_ = 0;
  std::map<std::pair<int, int64_t>, PyValue> files_;
};

}  // namespace dscpp::checkpoint
