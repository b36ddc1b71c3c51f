// Decisions about DeepSpeed features dscpp does not implement; see features.h.
#include "dscpp/config/features.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "dscpp/config/config_error.h"

namespace dscpp::config {

using nlohmann::json;

namespace {

// A section counts as switched on when it is present and not {"enabled": false}.
bool switched_on(const json* v) {
  if (!v || v->is_null()) return false;
  if (v->is_boolean()) return v->get<bool>();
  if (v->is_object() && v->contains("enabled")) {
    const json& e = (*v)["enabled"];
    return !(e.is_boolean() && !e.get<bool>()) && !(e.is_number() && e.get<double>() == 0);
  }
  return true;
}

void ignore(Diagnostics& diag, const std::string& what) {
  diag.ignored.push_back(what + ": not implemented by dscpp, ignored");
}

struct RemovedFeature {
  const char* key;
  const char* what;
};

// The features DeepSpeed 0.19 removed: ignoring them would train another model.
const RemovedFeature kRemovedFeatures[] = {
    {"compression_training", "DeepSpeed's compression library (quantisation/pruning)"},
    {"quantize_training", "Mixture-of-Quantization (MoQ)"},
    {"eigenvalue", "eigenvalue-based MoQ"},
    {"progressive_layer_drop", "progressive layer dropping"},
    {"curriculum_learning", "legacy curriculum learning"},
    {"sparse_attention", "DeepSpeed sparse attention"},
    {"amp", "NVIDIA Apex AMP (use \"fp16\" or \"bf16\")"},
    {"sparse_gradients", "sparse embedding gradients"},
    {"elasticity", "elastic training"},
    {"nebula", "Nebula checkpointing"},
    {"graph_harvesting", "graph harvesting"},
};

}  // namespace

void refuse_removed_features(Section& root, Diagnostics& diag) {
  for (const auto& r : kRemovedFeatures) {
    const json* v = root.raw(r.key);
    if (!v) continue;
    if (switched_on(v))
      throw ConfigError(r.key, fmt::format("{} is not supported by dscpp (DeepSpeed removed it "
                                           "in 0.19): remove the section or set \"enabled\": false",
                                           r.what));
    ignore(diag, fmt::format("'{}' ({}, disabled here)", r.key, r.what));
  }
}

void refuse_training_changes(Section& root, Diagnostics& diag) {
  auto refuse = [](const std::string& path, const std::string& what) {
    throw ConfigError(path, what +
                                " is not supported by dscpp, and training without it would "
                                "train another model: remove it or switch it off");
  };
  auto enabled = [](const json* section, const char* sub) -> const json* {
    if (!section || !section->is_object() || !section->contains(sub)) return nullptr;
    return &(*section)[sub];
  };
  // data_efficiency: DeepSpeed acts only when its own "enabled" is true (default false).
  if (const json* de = root.raw("data_efficiency"); de && de->is_object()) {
    const json* on = enabled(de, "enabled");
    const bool de_on = on && (on->is_boolean() ? on->get<bool>() : switched_on(de));
    const json* cl = enabled(enabled(de, "data_sampling"), "curriculum_learning");
    const json* ltd = enabled(enabled(de, "data_routing"), "random_ltd");
    if (de_on && cl && cl->is_object() && switched_on(cl) && cl->contains("enabled"))
      refuse("data_efficiency.data_sampling.curriculum_learning", "curriculum learning");
    if (de_on && ltd && ltd->is_object() && switched_on(ltd) && ltd->contains("enabled"))
      refuse("data_efficiency.data_routing.random_ltd", "random layer-token drop (random-LTD)");
    if (de_on)
      ignore(diag,
             "'data_efficiency' (data sampling and routing, neither curriculum nor "
             "random-LTD enabled)");
  }
  if (switched_on(root.raw("hybrid_engine")))
    refuse("hybrid_engine", "DeepSpeed's hybrid engine (RLHF generation with inference kernels)");
  if (const json* wq = root.raw("weight_quantization"); wq && !wq->is_null() && switched_on(wq))
    refuse("weight_quantization", "weight quantization");
  if (const json* op = root.raw("gradient_allreduce_op"); op && !op->is_null()) {
    const std::string v = op->is_string() ? lower(op->get<std::string>()) : "";
    if (v == "sum")
      refuse("gradient_allreduce_op",
             "\"sum\" (summed instead of averaged gradients: another effective learning rate)");
    if (v != "mean")
      throw ConfigError("gradient_allreduce_op",
                        "expected \"mean\" or \"sum\", found " + show_value(*op));
  }
}

void note_zero_features(Section& s, const ZeroConfig& c, Diagnostics& diag) {
  // NVMe offload (ZeRO-Infinity) needs the folder its swap files go in, as DeepSpeed asserts.
  auto need_nvme_path = [&](const char* key, const std::string& device,
                            const std::optional<std::string>& path) {
    if (device == "nvme" && (!path || path->empty()))
      throw ConfigError(s.path_of(std::string(key) + ".nvme_path"),
                        "expected the folder for NVMe offload's swap files (device \"nvme\"), "
                        "found nothing");
  };
  if (c.offload_optimizer)
    need_nvme_path("offload_optimizer", c.offload_optimizer->device,
                   c.offload_optimizer->nvme_path);
  if (c.offload_param)
    need_nvme_path("offload_param", c.offload_param->device, c.offload_param->nvme_path);
  if (c.offload_param && c.offload_param->device != "none" && c.stage != 3)
    ignore(diag, fmt::format("'{}' at stage {} (parameter offload needs stage 3)",
                             s.path_of("offload_param"), c.stage));
  if (c.zero_quantized_weights)
    ignore(diag, "'" + s.path_of("zero_quantized_weights") + "' (ZeRO++)");
  if (c.zero_quantized_nontrainable_weights)
    ignore(diag, "'" + s.path_of("zero_quantized_nontrainable_weights") + "' (ZeRO++)");
  if (c.zero_quantized_gradients)
    ignore(diag, "'" + s.path_of("zero_quantized_gradients") + "' (ZeRO++)");
  if (c.zero_hpz_partition_size > 1)
    ignore(diag,
           "'" + s.path_of("zero_hpz_partition_size") + "' > 1 (ZeRO++ hierarchical partitions)");
  if (c.round_robin_gradients) ignore(diag, "'" + s.path_of("round_robin_gradients") + "'");
  if (switched_on(s.raw("zenflow"))) ignore(diag, "'" + s.path_of("zenflow") + "'");
  for (const char* key :
       {"mics_shard_size", "mics_hierarchical_params_gather", "zeropp_loco_param"})
    if (s.raw(key))
      throw ConfigError(s.path_of(key),
                        "MiCS and LoCo-ZeRO++ are not supported by dscpp (DeepSpeed "
                        "removed them in 0.19)");
  // DeepSpeed tuning knobs that do not change what is computed: read and left alone.
  s.known({"use_all_reduce_for_fetch_params", "stage3_use_all_reduce_for_fetch_params",
           "module_granularity_threshold", "stage3_module_granularity_threshold",
           "allgather_sequential", "stage3_allgather_sequential", "legacy_stage1",
           "parameter_alignment", "memory_efficient_linear", "pipeline_loading_checkpoint",
           "override_module_apply", "log_trace_cache_warnings", "enable_sanity_checks",
           "save_muon_momentum_buffer_in_memory", "leaf_module", "compute_grad_norm"});
}

void check_optimizer(Section& s, OptimizerConfig& c, Diagnostics& diag) {
  static const std::vector<std::string> ours = {"Adam", "AdamW",   "Lamb", "SGD",
                                                "Lion", "Adagrad", "Muon", "MuonH"};
  std::string name = lower(c.type);
  for (const auto& o : ours)
    if (lower(o) == name) return;
  if (name == "onebitadam" || name == "zerooneadam" || name == "onebitlamb") {
    ignore(diag, fmt::format("{}'s compressed communication (optimizer.type '{}'); dscpp trains "
                             "with plain {} and exact communication",
                             c.type, c.type, name == "onebitlamb" ? "Lamb" : "Adam"));
    return;
  }
  std::string list;
  for (const auto& o : ours) list += (list.empty() ? "" : ", ") + o;
  std::string hint = closest_key(c.type, ours);
  throw ConfigError(
      s.path_of("type"),
      fmt::format("optimizer '{}' is not supported by dscpp; expected one of {}{}", c.type, list,
                  hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
}

void check_scheduler(Section& s, const SchedulerConfig& c, Diagnostics&) {
  // DeepSpeed looks the name up as a Python attribute: the spelling must be exact.
  static const std::vector<std::string> ours = {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR",
                                                "OneCycle", "LRRangeTest"};
  if (std::count(ours.begin(), ours.end(), c.type)) return;
  std::string list;
  for (const auto& o : ours) list += (list.empty() ? "" : ", ") + o;
  std::string hint = closest_key(c.type, ours);
  throw ConfigError(
      s.path_of("type"),
      fmt::format("scheduler '{}' is not supported by dscpp; expected one of {}{}", c.type, list,
                  hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
}

void note_ignored_features(Section& root, const DSConfig& c, Diagnostics& diag) {
  // Observers and tuners: harmless to leave out, but never silently.
  for (const char* key : {"wandb", "comet", "comms_logger", "autotuning", "datastates"}) {
    if (switched_on(root.raw(key))) ignore(diag, fmt::format("'{}'", key));
  }
  if (c.memory_breakdown) ignore(diag, "'memory_breakdown'");
  if (c.fp16.auto_cast) ignore(diag, "'fp16.auto_cast'");
  if (switched_on(root.raw("torch_autocast"))) ignore(diag, "'torch_autocast'");
  if (const json* comp = root.raw("compile");
      comp && comp->is_object() && comp->value("deepcompile", false) == true)
    ignore(diag, "'compile.deepcompile'");
  if (const json* tp = root.raw("tensor_parallel"); tp && tp->is_object()) {
    const json& size = tp->contains("autotp_size") ? (*tp)["autotp_size"] : (*tp)["tp_size"];
    if (size.is_number() && size.get<double>() > 1) ignore(diag, "'tensor_parallel' (AutoTP)");
  }
  const auto& ac = c.activation_checkpointing;
  if (ac.partition_activations) ignore(diag, "'activation_checkpointing.partition_activations'");
  if (ac.contiguous_memory_optimization)
    ignore(diag, "'activation_checkpointing.contiguous_memory_optimization'");
  // DeepSpeed keys with nothing for dscpp to do.
  root.known({"dump_state", "disable_allgather", "managed_gradient_accumulation",
              "disable_python_gc", "vocabulary_size", "use_data_before_expert_parallelism",
              "expert_parallel", "seq_parallel_communication_data_type", "timers", "log_level"});
}

}  // namespace dscpp::config
