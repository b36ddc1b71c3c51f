// A MoE checkpoint (moe_layout.h) as whole tensors by global key, for loading at another
// expert-parallel degree and for zero_to_fp32: each trainable parameter consolidated from the
// ZeRO files (universal_from_zero.h's consolidate_params), an expert parameter cut per global
// expert (moe_layout.h's ExpertSlot keys), then any model's parameter assembled from them (a
// stacked one from its experts' slices). Where a checkpoint saved at ep_size E > 1 keeps what:
//   dense parameters   param_shapes[0]; stages 1-2: group 0 of every data rank's ZeRO file
//                      (partitioned over the data ranks); stage 0: the model states' optimizer
//   expert parameters  param_shapes[1] (expert-parallel rank 0's local names; every rank's are
//                      alike); stages 1-2: group 1 of the files of data ranks R, R+E, R+2E, ...
//                      for expert-parallel rank R (partition k of the data-rank count / E, the
//                      expert-data group: DeepSpeed's real_dp_process_group of a MoE group);
//                      stage 0: expp_rank_R's optimizer, entries after the dense ones
// At ep_size 1 the experts are dense parameters (one group). A pipeline stage's files carry its
// mp_rank_XX (DeepSpeed's checkpoint_mp_rank) and its own ZeRO file names (pipe_layout.h): the
// same reading with those names. Reads files only; CheckpointError naming the file.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dscpp/nn/moe/expert_params.h"
#include "dscpp/runtime/checkpoint/torch_file.h"
#include "dscpp/runtime/checkpoint/universal.h"

namespace dscpp::checkpoint {

class ExpertRelayout {
 public:
  // model: the checkpoint's model-states file (read from `path`) as saved; mp_rank: its expert
  // and expp_rank files' mp_rank_XX; zero_file(r): data rank r's ZeRO file (null: the plain
  // engine's, find_zero_states).
  ExpertRelayout(const std::string& dir, const std::string& tag, const PyValue& model,
                 const std::string& path, int mp_rank = 0,
                 std::function<std::string(int)> zero_file = nullptr);
  // The same over whole parameters already read (a pipeline checkpoint's, pipe_checkpoint.h),
  // named as the one-rank model of expert map `one_rank` names them; where: the checkpoint, for
  // errors.
  ExpertRelayout(std::string where, std::vector<UniversalParam> whole,
                 const std::map<std::string, nn::moe::ExpertParam>& one_rank);
  // Parameter `name` of a model whose expert parameters are `experts` (its own, at any
  // expert-parallel degree and rank): whole, with its optimizer states and step.
  UniversalParam param(const std::string& name,
                       const std::map<std::string, nn::moe::ExpertParam>& experts) const;
  bool has(const std::string& key) const { return by_key_.count(key) > 0; }

 private:
  void add(UniversalParam p, const std::map<std::string, nn::moe::ExpertParam>& experts);
  std::string where_;
  std::map<std::string, UniversalParam> by_key_;
};

}  // namespace dscpp::checkpoint
