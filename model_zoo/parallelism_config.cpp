// ParallelismConfig: reading and the world-size arithmetic.
#include "dscpp/model_zoo/parallelism_config.h"

#include <fmt/format.h>

#include "dscpp/config/config_error.h"
#include "dscpp/config/section.h"

namespace dscpp::model_zoo {

ParallelismConfig ParallelismConfig::from_json(const nlohmann::json& j, const std::string& path) {
  if (!j.is_object())
    throw ConfigError(path,
                      "expected an object with tensor_model_parallel_size, "
                      "pipeline_model_parallel_size, data_parallel_size, found " +
                          config::show_value(j));
  config::Diagnostics diag;
  diag.strict = true;
  config::Section s(&j, path, &diag);
  ParallelismConfig c;
  // Each degree at most 2^20, so that their product (the world) cannot overflow.
  constexpr int64_t kMaxDegree = int64_t{1} << 20;
  c.tensor_model_parallel_size = s.get_int("tensor_model_parallel_size", 1, 1, kMaxDegree);
  c.pipeline_model_parallel_size = s.get_int("pipeline_model_parallel_size", 1, 1, kMaxDegree);
  c.data_parallel_size = s.get_int("data_parallel_size", 0, 0, kMaxDegree);
  c.sequence_parallel = s.get_bool("sequence_parallel", false);
  c.async_tensor_model_parallel_allreduce =
      s.get_bool("async_tensor_model_parallel_allreduce", true);
  c.tp_comm_overlap = s.get_bool("tp_comm_overlap", false);
  c.tp_comm_overlap_num_splits = s.get_int("tp_comm_overlap_num_splits", 2, 1, kMaxDegree);
  c.expert_model_parallel_size = s.get_int("expert_model_parallel_size", 1, 1, kMaxDegree);
  c.pipeline_parallel_schedule = s.get_choice("pipeline_parallel_schedule", "auto",
                                              {"auto", "1f1b", "interleaved", "zb-h1", "zb-v"});
  c.sequence_parallel_size = s.get_int("sequence_parallel_size", 1, 1, kMaxDegree);
  const int64_t context = s.get_int("context_parallel_size", 1, 1, kMaxDegree);
  const std::string comm_type =
      s.get_choice("cp_comm_type", "p2p", {"p2p", "a2a", "all_gather", "a2a+p2p"});
  s.finish();
  if (context > 1 && comm_type != "a2a")
    throw ConfigError(
        path + ".cp_comm_type",
        fmt::format("context parallelism by \"{}\" ({}) is not implemented: "
                    "dscpp's is DeepSpeed-Ulysses' all-to-all, cp_comm_type \"a2a\" "
                    "(or sequence_parallel_size)",
                    comm_type,
                    comm_type == "all_gather" ? "the gathered keys and values" : "ring attention"));
  if (context > 1 && c.sequence_parallel_size > 1 && context != c.sequence_parallel_size)
    throw ConfigError(path + ".context_parallel_size",
                      fmt::format("context_parallel_size {} and sequence_parallel_size {} name "
                                  "the same degree: give one, or the same value",
                                  context, c.sequence_parallel_size));
  if (context > 1) c.sequence_parallel_size = context;
  if (c.tp_comm_overlap && !c.async_tensor_model_parallel_allreduce)
    throw ConfigError(path + ".tp_comm_overlap",
                      "the pipelined forward is the async column-parallel function's: it needs "
                      "async_tensor_model_parallel_allreduce true, found false");
  if (c.sequence_parallel && c.tensor_model_parallel_size == 1)
    throw ConfigError(path + ".sequence_parallel",
                      "sequence parallelism splits the sequence across the tensor-parallel "
                      "ranks: it needs tensor_model_parallel_size > 1, found 1");
  return c;
}

nlohmann::json ParallelismConfig::to_json() const {
  nlohmann::json j = {{"tensor_model_parallel_size", tensor_model_parallel_size},
                      {"pipeline_model_parallel_size", pipeline_model_parallel_size},
                      {"sequence_parallel", sequence_parallel}};
  if (data_parallel_size > 0) j["data_parallel_size"] = data_parallel_size;
  // Written only off the default, so configs written before the key read back unchanged.
  if (!async_tensor_model_parallel_allreduce) j["async_tensor_model_parallel_allreduce"] = false;
  if (tp_comm_overlap) j["tp_comm_overlap"] = true;
  if (tp_comm_overlap_num_splits != 2) j["tp_comm_overlap_num_splits"] = tp_comm_overlap_num_splits;
  if (expert_model_parallel_size != 1) j["expert_model_parallel_size"] = expert_model_parallel_size;
  if (pipeline_parallel_schedule != "auto")
    j["pipeline_parallel_schedule"] = pipeline_parallel_schedule;
  if (sequence_parallel_size != 1) j["sequence_parallel_size"] = sequence_parallel_size;
  return j;
}

ParallelismConfig ParallelismConfig::resolve(int64_t world_size) const {
  const int64_t model =
      tensor_model_parallel_size * pipeline_model_parallel_size * sequence_parallel_size;
  const std::string sequence =
      sequence_parallel_size > 1
          ? fmt::format(" x sequence_parallel_size {}", sequence_parallel_size)
          : std::string();
  ParallelismConfig r = *this;
  if (data_parallel_size == 0) {
    if (world_size % model != 0)
      throw ConfigError(
          "parallelism",
          fmt::format("tensor_model_parallel_size {} x pipeline_model_parallel_size {}{} = {} "
                      "does not divide the world size {}",
                      tensor_model_parallel_size, pipeline_model_parallel_size, sequence, model,
                      world_size));
    r.data_parallel_size = world_size / model;
  } else if (model * data_parallel_size != world_size) {
    throw ConfigError(
        "parallelism",
        fmt::format("tensor_model_parallel_size {} x pipeline_model_parallel_size {}{} x "
                    "data_parallel_size {} = {}, but the job has {} ranks",
                    tensor_model_parallel_size, pipeline_model_parallel_size, sequence,
                    data_parallel_size, model * data_parallel_size, world_size));
  }
  // The experts split over the ranks of the data axis, which under DeepSpeed-Ulysses holds each
  // data rank's sequence ranks too (the engine's group): their tokens are slices of sequences,
  // routed as any others.
  const int64_t data_axis = r.data_parallel_size * sequence_parallel_size;
  if (data_axis % expert_model_parallel_size != 0)
    throw ConfigError(
        "parallelism.expert_model_parallel_size",
        fmt::format("the experts split over ranks of the data axis: expected a divisor of the "
                    "data degree{} ({}), found {}",
                    sequence_parallel_size > 1 ? " x sequence_parallel_size" : "", data_axis,
                    expert_model_parallel_size));
  return r;
}

}  // namespace dscpp::model_zoo
