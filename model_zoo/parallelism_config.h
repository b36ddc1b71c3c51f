// ParallelismConfig: the model config's `parallelism` object (the seed's and Megatron's names)
// giving the tensor, pipeline, sequence (Ulysses) and data degrees of a job. The data degree may be
// left out (or 0): it is what remains of the world. resolve() checks the three against the world
// size and names the arithmetic when they disagree.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace dscpp::model_zoo {

struct ParallelismConfig {
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  int64_t data_parallel_size = 0;  // 0: world / (tensor * pipeline)
  bool sequence_parallel = false;  // Korthikanti et al.; needs tensor_model_parallel_size > 1
  // Megatron's: the column-parallel backward overlaps its collectives with its products
  // (nn/linear_async_communication.h); false: synchronous. The same values either way.
  bool async_tensor_model_parallel_allreduce = true;
  // Megatron's: the forward collectives of the parallel linears pipelined with their products
  // in tp_comm_overlap_num_splits pieces (nn/tp_comm_overlap.h); needs the async option. The
  // same values to 1e-6 either way; off by default, as Megatron's.
  bool tp_comm_overlap = false;
  int64_t tp_comm_overlap_num_splits = 2;
  // Megatron's: the routed experts of each MoE layer split over this many ranks of the data
  // axis (DeepSpeed's ep_size; comm::new_expert_groups). Must divide the data degree and the
  // model's num_experts; above 1 only for an MoE model.
  int64_t expert_model_parallel_size = 1;
  // The pipeline's schedule (torchtitan's pipeline_parallel_schedule key; dscpp's names, as
  // the ds_config's pipeline.schedule: "auto", "1f1b", "interleaved", "zb-h1", "zb-v").
  std::string pipeline_parallel_schedule = "auto";
  // DeepSpeed-Ulysses: the ranks that split each sequence, their all-to-alls turning the split
  // sequence into split heads around attention (DeepSpeed's sequence_parallel_size; Megatron's
  // context_parallel_size with cp_comm_type "a2a" is read as it). Ring attention (Megatron's
  // cp_comm_type "p2p", its default) is refused by name.
  int64_t sequence_parallel_size = 1;

  // `j` is the `parallelism` object; `path` names it in errors ("parallelism").
  static ParallelismConfig from_json(const nlohmann::json& j, const std::string& path);
  nlohmann::json to_json() const;
  // The degrees with the data degree filled in for `world_size` ranks; a ConfigError that
  // shows the arithmetic when tensor * pipeline * data is not the world size.
  ParallelismConfig resolve(int64_t world_size) const;
  bool any_model_parallelism() const {
    return tensor_model_parallel_size > 1 || pipeline_model_parallel_size > 1 ||
           sequence_parallel_size > 1;
  }
};

}  // namespace dscpp::model_zoo
