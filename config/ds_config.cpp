// parse_ds_config: the ds_config sections into typed structs, with DeepSpeed's defaults,
// deprecated spellings and batch-size rule.
#include "dscpp/config/ds_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "dscpp/config/config_error.h"
#include "dscpp/config/features.h"
#include "dscpp/config/json_bounds.h"
#include "dscpp/config/json_text.h"
#include "dscpp/config/key_fates.h"
#include "dscpp/config/section.h"

namespace dscpp {

using config::Diagnostics;
using config::is_auto;
using config::lower;
using config::Section;
using nlohmann::json;

namespace {

DSConfig parse_ds_config_checked(const json& input, const ConfigOptions& options);

// Fills "auto" values from the caller's table (dotted paths), as Hugging Face does.
void fill_auto(json& root, const json& auto_values) {
  if (!auto_values.is_object()) throw ConfigError("", "auto values must be a JSON object");
  for (const auto& [path, value] : auto_values.items()) {
    json* node = &root;
    size_t start = 0;
    while (node && start <= path.size()) {
      size_t dot = path.find('.', start);
      std::string part =
          path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      node = node->is_object() && node->contains(part) ? &(*node)[part] : nullptr;
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    if (node && is_auto(*node)) *node = value;
  }
}

// An "auto" that only the program can resolve (batch sizes, optimizer and scheduler
// params) must have been filled in by now.
void require_resolved(const json& v, const std::string& path, const std::string& hint) {
  if (is_auto(v))
    throw ConfigError(path,
                      "is \"auto\" and no value was supplied for it: " +
                          (hint.empty() ? "pass it to dscpp::initialize (auto_values)" : hint) +
                          " or write a number in the config");
  if (v.is_object())
    for (const auto& [k, sub] : v.items()) require_resolved(sub, path + "." + k, hint);
}

FP16Config read_fp16(Section s) {
  FP16Config c;
  c.enabled = s.get_bool("enabled", c.enabled);
  c.auto_cast = s.get_bool("auto_cast", c.auto_cast);
  c.loss_scale = s.get_double("loss_scale", c.loss_scale, 0.0);
  c.initial_scale_power = s.get_int("initial_scale_power", c.initial_scale_power, 0, 127);
  c.loss_scale_window = s.get_int("loss_scale_window", c.loss_scale_window);
  c.hysteresis = s.get_int("hysteresis", c.hysteresis, 1);
  c.consecutive_hysteresis = s.get_bool("consecutive_hysteresis", c.consecutive_hysteresis);
  c.min_loss_scale = s.get_double("min_loss_scale", c.min_loss_scale);
  c.fp16_master_weights_and_grads =
      s.get_bool("fp16_master_weights_and_grads", c.fp16_master_weights_and_grads);
  if (c.enabled && c.loss_scale == 0) {
    if (c.loss_scale_window <= 0) s.fail("loss_scale_window", "an integer > 0 for dynamic scaling");
    if (c.min_loss_scale <= 0) s.fail("min_loss_scale", "a number > 0 for dynamic scaling");
  }
  s.finish();
  return c;
}

BF16Config read_bf16(Section s) {
  BF16Config c;
  c.enabled = s.get_bool("enabled", c.enabled);
  c.immediate_grad_update = s.get_bool("immediate_grad_update", c.immediate_grad_update);
  c.check_grad_overflow = s.get_bool("check_grad_overflow", c.check_grad_overflow);
  c.bf16_master_weights_and_grads =
      s.get_bool("bf16_master_weights_and_grads", c.bf16_master_weights_and_grads);
  c.bf16_optimizer_states = s.get_bool("bf16_optimizer_states", c.bf16_optimizer_states);
  s.finish();
  return c;
}

const std::vector<std::string> kOffloadDevices = {"none", "cpu", "nvme"};

// DeepSpeed holds nvme_path as a pathlib.Path, which drops trailing slashes.
std::optional<std::string> read_path(Section& s, const std::string& key) {
  auto p = s.get_opt_string(key);
  while (p && p->size() > 1 && p->back() == '/') p->pop_back();
  return p;
}

OffloadOptimizerConfig read_offload_optimizer(Section s) {
  OffloadOptimizerConfig c;
  c.device = s.get_choice("device", c.device, kOffloadDevices);
  c.nvme_path = read_path(s, "nvme_path");
  c.buffer_count = s.get_int("buffer_count", c.buffer_count, 0);
  c.pin_memory = s.get_bool("pin_memory", c.pin_memory);
  c.pipeline_read = s.get_bool("pipeline_read", c.pipeline_read);
  c.pipeline_write = s.get_bool("pipeline_write", c.pipeline_write);
  c.fast_init = s.get_bool("fast_init", c.fast_init);
  c.ratio = s.get_double("ratio", c.ratio, 0.0, 1.0);
  s.known({"super_offload", "cpuadam_cores_perc"});
  s.finish();
  return c;
}

OffloadParamConfig read_offload_param(Section s) {
  OffloadParamConfig c;
  c.device = s.get_choice("device", c.device, kOffloadDevices);
  c.nvme_path = read_path(s, "nvme_path");
  c.buffer_count = s.get_int("buffer_count", c.buffer_count, 0);
  c.buffer_size = s.get_int("buffer_size", c.buffer_size, 0);
  c.max_in_cpu = s.get_int("max_in_cpu", c.max_in_cpu, 0);
  c.pin_memory = s.get_bool("pin_memory", c.pin_memory);
  s.finish();
  return c;
}

// A key DeepSpeed accepts under two names (pydantic alias and field name).
int64_t get_aliased_int(Section& s, const std::string& name, const std::string& alias,
                        int64_t def) {
  s.raw(name);  // both spellings are known keys, whichever is used
  s.raw(alias);
  if (s.has(name) && s.has(alias))
    throw ConfigError(s.path_of(alias), fmt::format("given together with its alias '{}'", name));
  return s.has(name) ? s.get_int(name, def, 0) : s.get_int(alias, def, 0);
}

ZeroConfig read_zero(Section s, const Section& root, Diagnostics& diag) {
  ZeroConfig c;
  c.stage = static_cast<int>(s.get_int("stage", c.stage, 0, 3));
  c.contiguous_gradients = s.get_bool("contiguous_gradients", c.contiguous_gradients);
  c.reduce_scatter = s.get_bool("reduce_scatter", c.reduce_scatter);
  c.reduce_bucket_size = s.get_int("reduce_bucket_size", c.reduce_bucket_size, 1);
  c.use_multi_rank_bucket_allreduce =
      s.get_bool("use_multi_rank_bucket_allreduce", c.use_multi_rank_bucket_allreduce);
  c.allgather_partitions = s.get_bool("allgather_partitions", c.allgather_partitions);
  c.allgather_bucket_size = s.get_int("allgather_bucket_size", c.allgather_bucket_size, 0);
  // DeepSpeed's default depends on the stage: overlap only where stage 3 needs it.
  c.overlap_comm = s.get_bool("overlap_comm", c.stage == 3);
  c.dscpp_deferred_allgather = s.get_bool("dscpp_deferred_allgather", c.dscpp_deferred_allgather);
  c.load_from_fp32_weights = s.get_bool("load_from_fp32_weights", c.load_from_fp32_weights);
  c.elastic_checkpoint = s.get_bool("elastic_checkpoint", c.elastic_checkpoint);
  c.sub_group_size = s.get_int("sub_group_size", c.sub_group_size, 0);
  c.stage3_prefetch_bucket_size = get_aliased_int(
      s, "stage3_prefetch_bucket_size", "prefetch_bucket_size", c.stage3_prefetch_bucket_size);
  c.stage3_param_persistence_threshold =
      get_aliased_int(s, "stage3_param_persistence_threshold", "param_persistence_threshold",
                      c.stage3_param_persistence_threshold);
  c.stage3_model_persistence_threshold =
      get_aliased_int(s, "stage3_model_persistence_threshold", "model_persistence_threshold",
                      c.stage3_model_persistence_threshold);
  c.stage3_max_live_parameters = get_aliased_int(
      s, "stage3_max_live_parameters", "max_live_parameters", c.stage3_max_live_parameters);
  c.stage3_max_reuse_distance = get_aliased_int(s, "stage3_max_reuse_distance",
                                                "max_reuse_distance", c.stage3_max_reuse_distance);
  bool gather_new = s.has("stage3_gather_16bit_weights_on_model_save") ||
                    s.has("gather_16bit_weights_on_model_save");
  c.stage3_gather_16bit_weights_on_model_save =
      s.has("gather_16bit_weights_on_model_save")
          ? s.get_bool("gather_16bit_weights_on_model_save", false)
          : s.get_bool("stage3_gather_16bit_weights_on_model_save", false);
  if (s.has("stage3_gather_fp16_weights_on_model_save")) {
    if (gather_new)
      throw ConfigError(s.path_of("stage3_gather_fp16_weights_on_model_save"),
                        "deprecated key given together with its replacement "
                        "'stage3_gather_16bit_weights_on_model_save'");
    c.stage3_gather_16bit_weights_on_model_save =
        s.get_bool("stage3_gather_fp16_weights_on_model_save", false);
    diag.warnings.push_back(fmt::format("'{}' is deprecated: use '{}'",
                                        s.path_of("stage3_gather_fp16_weights_on_model_save"),
                                        s.path_of("stage3_gather_16bit_weights_on_model_save")));
  }
  s.known({"gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save"});
  c.ignore_unused_parameters = s.get_bool("ignore_unused_parameters", c.ignore_unused_parameters);
  c.round_robin_gradients = s.get_bool("round_robin_gradients", c.round_robin_gradients);
  c.zero_hpz_partition_size = s.get_int("zero_hpz_partition_size", c.zero_hpz_partition_size, 0);
  c.zero_quantized_weights = s.get_bool("zero_quantized_weights", c.zero_quantized_weights);
  c.zero_quantized_nontrainable_weights =
      s.get_bool("zero_quantized_nontrainable_weights", c.zero_quantized_nontrainable_weights);
  c.zero_quantized_gradients = s.get_bool("zero_quantized_gradients", c.zero_quantized_gradients);

  Section oo = s.sub("offload_optimizer");
  if (oo.present()) c.offload_optimizer = read_offload_optimizer(oo);
  Section op = s.sub("offload_param");
  if (op.present()) c.offload_param = read_offload_param(op);
  // Deprecated booleans from DeepSpeed's first offload release.
  s.known({"cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory"});
  auto deprecated_offload = [&](const char* key, const char* replacement, auto& target) {
    if (!s.has(key)) return;
    bool on = s.get_bool(key, false);
    diag.warnings.push_back(
        fmt::format("'{}' is deprecated: use '{}'", s.path_of(key), s.path_of(replacement)));
    if (!on) return;
    if (target)
      throw ConfigError(s.path_of(key), fmt::format("given together with '{}'", replacement));
    target.emplace();
    target->device = "cpu";
  };
  deprecated_offload("cpu_offload", "offload_optimizer", c.offload_optimizer);
  deprecated_offload("cpu_offload_param", "offload_param", c.offload_param);
  if (s.has("cpu_offload_use_pin_memory")) {
    s.get_bool("cpu_offload_use_pin_memory", true);
    diag.warnings.push_back(
        fmt::format("'{}' is deprecated: use pin_memory in offload_param or "
                    "offload_optimizer",
                    s.path_of("cpu_offload_use_pin_memory")));
  }
  // DeepSpeed's stages 1-2 never read ratio (only stage 3 has partial offload): the whole
  // partition is offloaded there, and that is said.
  if (c.offload_optimizer && c.offload_optimizer->ratio < 1.0 && c.stage != 3 &&
      c.offload_optimizer->device != "none")
    diag.ignored.push_back(fmt::format(
        "'{}' at stage {}: partial offload is stage 3's (DeepSpeed reads ratio there only); "
        "the whole partition is offloaded",
        s.path_of("offload_optimizer.ratio"), c.stage));
  config::note_zero_features(s, c, diag);
  s.finish();
  (void)root;
  return c;
}

// DeepSpeed's deprecated form: "zero_optimization": true means stage 1.
ZeroConfig read_zero_bool(Section& root, bool on, Diagnostics& diag) {
  ZeroConfig c;
  c.stage = on ? 1 : 0;
  if (on) c.allgather_bucket_size = root.get_int("allgather_size", 500000000, 0);
  root.known({"allgather_size"});
  diag.warnings.push_back(
      "'zero_optimization' as a boolean is deprecated: use {\"zero_optimization\": {\"stage\": "
      "N}}");
  return c;
}

// DeepSpeed lower-cases the names of its own optimizers and leaves others (torch.optim
// names, 1-bit optimizers) as written.
const std::vector<std::string> kDeepSpeedOptimizers = {
    "adagrad", "adam", "adamw", "lamb", "muadam", "muadamw", "musgd", "lion", "muon"};

std::optional<OptimizerConfig> read_optimizer(Section s, Diagnostics& diag,
                                              const std::string& auto_hint) {
  if (!s.present()) return std::nullopt;
  OptimizerConfig c;
  auto type = s.get_opt_string("type");
  if (!type) return std::nullopt;  // DeepSpeed: no type, no optimizer from the config
  c.type = *type;
  if (std::count(kDeepSpeedOptimizers.begin(), kDeepSpeedOptimizers.end(), lower(c.type)))
    c.type = lower(c.type);
  const json* params = s.raw("params");
  if (params && !params->is_null()) {
    if (!params->is_object()) s.fail("params", "an object");
    require_resolved(*params, s.path_of("params"), auto_hint);
    c.params = *params;
  }
  s.known({"legacy_fusion"});
  config::check_optimizer(s, c, diag);
  s.finish();
  return c;
}

std::optional<SchedulerConfig> read_scheduler(Section s, Diagnostics& diag,
                                              const std::string& auto_hint) {
  if (!s.present()) return std::nullopt;
  SchedulerConfig c;
  auto type = s.get_opt_string("type");
  if (!type) return std::nullopt;
  c.type = *type;
  const json* params = s.raw("params");
  if (params && !params->is_null()) {
    if (!params->is_object()) s.fail("params", "an object");
    require_resolved(*params, s.path_of("params"), auto_hint);
    c.params = *params;
  }
  config::check_scheduler(s, c, diag);
  s.finish();
  return c;
}

ActivationCheckpointingConfig read_activation_checkpointing(Section s) {
  ActivationCheckpointingConfig c;
  c.partition_activations = s.get_bool("partition_activations", c.partition_activations);
  c.contiguous_memory_optimization =
      s.get_bool("contiguous_memory_optimization", c.contiguous_memory_optimization);
  c.cpu_checkpointing = s.get_bool("cpu_checkpointing", c.cpu_checkpointing);
  c.number_checkpoints = s.get_opt_int("number_checkpoints", 0);
  c.synchronize_checkpoint_boundary =
      s.get_bool("synchronize_checkpoint_boundary", c.synchronize_checkpoint_boundary);
  c.profile = s.get_bool("profile", c.profile);
  s.finish();
  return c;
}

PipelineConfig read_pipeline(Section s) {
  PipelineConfig c;
  if (const json* v = s.raw("stages"); v && !is_auto(*v)) {
    if (!v->is_number_integer() || v->get<int64_t>() < 1)
      s.fail("stages", "\"auto\" or an integer >= 1");
    c.stages = std::to_string(v->get<int64_t>());
  }
  c.partition = s.get_string("partition", c.partition);
  c.seed_layers = s.get_bool("seed_layers", c.seed_layers);
  c.activation_checkpoint_interval =
      s.get_int("activation_checkpoint_interval", c.activation_checkpoint_interval, 0);
  c.pipe_partitioned = s.get_bool("pipe_partitioned", c.pipe_partitioned);
  c.grad_partitioned = s.get_bool("grad_partitioned", c.grad_partitioned);
  c.schedule =
      s.get_choice("schedule", c.schedule, {"auto", "1f1b", "interleaved", "zb-h1", "zb-v"});
  s.known({"use_reentrant"});
  s.finish();
  return c;
}

MonitorConfig read_monitor(Section s) {
  MonitorConfig c;
  c.enabled = s.get_bool("enabled", c.enabled);
  c.output_path = s.get_string("output_path", c.output_path);
  c.job_name = s.get_string("job_name", c.job_name);
  s.finish();
  return c;
}

WandbConfig read_wandb(Section s) {
  WandbConfig c;
  c.enabled = s.get_bool("enabled", c.enabled);
  c.group = s.get_opt_string("group");
  c.team = s.get_opt_string("team");
  c.project = s.get_string("project", c.project);
  s.finish();
  return c;
}

FlopsProfilerConfig read_flops_profiler(Section s) {
  FlopsProfilerConfig c;
  c.enabled = s.get_bool("enabled", c.enabled);
  c.recompute_fwd_factor = s.get_double("recompute_fwd_factor", c.recompute_fwd_factor);
  c.profile_step = s.get_int("profile_step", c.profile_step);
  c.module_depth = s.get_int("module_depth", c.module_depth);
  c.top_modules = s.get_int("top_modules", c.top_modules);
  c.detailed = s.get_bool("detailed", c.detailed);
  c.output_file = s.get_opt_string("output_file");
  s.finish();
  return c;
}

CheckpointConfig read_checkpoint(Section s) {
  CheckpointConfig c;
  c.tag_validation = s.get_choice("tag_validation", c.tag_validation, {"IGNORE", "WARN", "FAIL"});
  c.load_universal = s.get_bool("load_universal", c.load_universal);
  c.use_node_local_storage = s.get_bool("use_node_local_storage", c.use_node_local_storage);
  Section pw = s.sub("parallel_write");
  c.parallel_write_pipeline_stage = pw.get_bool("pipeline_stage", false);
  pw.finish();
  s.known({"writer"});
  s.finish();
  return c;
}

const std::vector<std::string> kDtypes = {"fp32", "fp16", "bf16"};

DataTypesConfig read_data_types(Section s) {
  DataTypesConfig c;
  if (s.has("grad_accum_dtype")) c.grad_accum_dtype = s.get_choice("grad_accum_dtype", "", kDtypes);
  s.known({"param_dtype", "buffer_dtype", "keep_in_fp32_modules"});
  s.finish();
  return c;
}

AioConfig read_aio(Section s) {
  AioConfig c;
  c.block_size = s.get_int("block_size", c.block_size, 1);
  c.queue_depth = s.get_int("queue_depth", c.queue_depth, 1);
  // DeepSpeed's current name, and thread_count before it.
  c.intra_op_parallelism = s.has("intra_op_parallelism")
                               ? s.get_int("intra_op_parallelism", c.intra_op_parallelism, 1)
                               : s.get_int("thread_count", c.intra_op_parallelism, 1);
  c.single_submit = s.get_bool("single_submit", c.single_submit);
  c.overlap_events = s.get_bool("overlap_events", c.overlap_events);
  c.use_gds = s.get_bool("use_gds", c.use_gds);
  s.finish();
  return c;
}

// DeepSpeed's rule: any two of the three give the third; all three must then agree.
void resolve_batch(DSConfig& c, Section& root, const std::string& auto_hint) {
  const char* keys[] = {"train_batch_size", "train_micro_batch_size_per_gpu",
                        "gradient_accumulation_steps"};
  std::optional<int64_t> v[3];
  for (int i = 0; i < 3; ++i) {
    if (const json* raw = root.raw(keys[i])) require_resolved(*raw, keys[i], auto_hint);
    v[i] = root.get_opt_int(keys[i], 1);
  }
  auto& [tb, mb, ga] = v;
  const int64_t w = c.world_size;
  if (!tb && !mb)
    throw ConfigError("",
                      "either train_batch_size or train_micro_batch_size_per_gpu must be given");
  // micro * accumulation * world, refused where it leaves int64 (DeepSpeed's Python
  // integers never overflow; ours would wrap to a wrong batch).
  auto product = [&](int64_t micro, int64_t accumulation) {
    int64_t mw = 0, out = 0;
    if (__builtin_mul_overflow(micro, w, &mw) || __builtin_mul_overflow(mw, accumulation, &out))
      throw ConfigError(
          "train_batch_size",
          fmt::format("train_micro_batch_size_per_gpu ({}) * gradient_accumulation_steps ({}) * "
                      "data-parallel world size ({}) is beyond a 64-bit integer",
                      micro, accumulation, w));
    return out;
  };
  // The one derived from train_batch_size: its quotient by the two others' product, which
  // must divide it (DeepSpeed floors and then fails its agreement check; the error here says
  // which division it was). train_batch_size comes as `total`: a C++17 lambda cannot capture
  // the structured binding.
  auto quotient = [&](int64_t total, int64_t by, const std::string& factors, const char* derived) {
    int64_t per = 0;
    const bool overflow = __builtin_mul_overflow(by, w, &per);
    if (overflow || total % per != 0)
      throw ConfigError(
          "train_batch_size",
          fmt::format("train_batch_size ({}) is not a multiple of {} * data-parallel world size "
                      "({}) = {}, so {} has no whole value",
                      total, factors, w,
                      overflow ? std::string("more than 2^63") : std::to_string(per), derived));
    return total / per;
  };
  if (tb && mb && !ga) {
    ga = quotient(*tb, *mb, fmt::format("train_micro_batch_size_per_gpu ({})", *mb),
                  "gradient_accumulation_steps");
  } else if (tb && ga && !mb) {
    mb = quotient(*tb, *ga, fmt::format("gradient_accumulation_steps ({})", *ga),
                  "train_micro_batch_size_per_gpu");
  } else if (mb && ga && !tb) {
    tb = product(*mb, *ga);
  } else if (tb && !mb && !ga) {
    ga = 1;
    mb = quotient(*tb, 1, "gradient_accumulation_steps (1, not given)",
                  "train_micro_batch_size_per_gpu");
  } else if (mb && !tb && !ga) {
    ga = 1;
    tb = product(*mb, 1);
  }
  if (*mb <= 0 || *ga <= 0 || *tb != product(*mb, *ga))
    throw ConfigError(
        "train_batch_size",
        fmt::format("the batch sizes do not agree: train_batch_size ({}) must equal "
                    "train_micro_batch_size_per_gpu ({}) * gradient_accumulation_steps ({}) * "
                    "data-parallel world size ({}) = {}",
                    *tb, *mb, *ga, w, product(*mb, *ga)));
  c.train_batch_size = *tb;
  c.train_micro_batch_size_per_gpu = *mb;
  c.gradient_accumulation_steps = *ga;
}

}  // namespace

DSConfig parse_ds_config(const json& input, const ConfigOptions& options) {
  try {
    return parse_ds_config_checked(input, options);
  } catch (const json::exception& e) {
    // A value nlohmann refuses to convert or print (the checks above should leave none):
    // still our error, never an escape of the library's own.
    throw ConfigError("", std::string("cannot read the config: ") + e.what());
  }
}

ActivationCheckpointingConfig read_activation_checkpointing_section(const json& ds_config) {
  if (!ds_config.is_object()) return {};
  Diagnostics diag;  // (its notes of unknown keys: the engine's reading reports them)
  Section root(&ds_config, "", &diag);
  return read_activation_checkpointing(root.sub("activation_checkpointing"));
}

namespace {

DSConfig parse_ds_config_checked(const json& input, const ConfigOptions& options) {
  // Before any recursive copy or walk: depth and UTF-8 (a program may hand us any JSON).
  config::check_json_bounds(input, "");
  config::check_json_bounds(options.auto_values, "auto values");
  if (!input.is_object()) throw ConfigError("", "a ds_config must be a JSON object");
  if (options.world_size < 1) throw ConfigError("", "the data-parallel world size must be >= 1");
  DSConfig c;
  c.source = input;
  fill_auto(c.source, options.auto_values);
  Diagnostics diag;
  diag.strict = options.strict;
  Section root(&c.source, "", &diag);
  // DeepSpeed-Ulysses: its ranks share each sample, so the batch rule counts data ranks only.
  c.sequence_parallel_size = root.get_int("sequence_parallel_size", 1, 1, int64_t{1} << 20);
  if (options.world_size % c.sequence_parallel_size != 0)
    throw ConfigError("sequence_parallel_size",
                      fmt::format("the engine's {} ranks do not split into sequence-parallel "
                                  "groups of {}: expected a divisor of {}, found {}",
                                  options.world_size, c.sequence_parallel_size, options.world_size,
                                  c.sequence_parallel_size));
  c.world_size = options.world_size / c.sequence_parallel_size;

  config::refuse_removed_features(root, diag);
  config::refuse_training_changes(root, diag);
  resolve_batch(c, root, options.auto_values_hint);
  c.steps_per_print = root.get_opt_int("steps_per_print", 0);
  c.wall_clock_breakdown = root.get_bool("wall_clock_breakdown", false);
  c.memory_breakdown = root.get_bool("memory_breakdown", false);
  if (const json* gc = root.raw("gradient_clipping"); gc && gc->is_boolean()) {
    // Python compares True == 1: DeepSpeed clips at 1.0 for `true`, 0 (off) for `false`.
    c.gradient_clipping = gc->get<bool>() ? 1.0 : 0.0;
    diag.warnings.push_back(
        fmt::format("gradient_clipping: expected a number, found {}; taken as {}", gc->dump(),
                    c.gradient_clipping));
  } else {
    c.gradient_clipping = root.get_double("gradient_clipping", 1.0, 0.0);
  }
  c.prescale_gradients = root.get_bool("prescale_gradients", false);
  c.gradient_predivide_factor = root.get_double("gradient_predivide_factor", 1.0, 0.0);
  if (root.has("communication_data_type"))
    c.communication_data_type = root.get_choice("communication_data_type", "", kDtypes);
  c.zero_allow_untested_optimizer = root.get_bool("zero_allow_untested_optimizer", false);
  c.zero_force_ds_cpu_optimizer = root.get_bool("zero_force_ds_cpu_optimizer", true);
  c.dataloader_drop_last = root.get_bool("dataloader_drop_last", false);

  c.fp16 = read_fp16(root.sub("fp16"));
  // "bfloat16" is the old spelling; DeepSpeed reads it only when "bf16" is absent.
  c.bf16 = read_bf16(root.has("bf16") || !root.has("bfloat16") ? root.sub("bf16")
                                                               : root.sub("bfloat16"));
  root.known({"bf16", "bfloat16"});
  if (c.fp16.enabled && c.bf16.enabled)
    throw ConfigError("bf16.enabled", "fp16 and bf16 cannot both be enabled");

  const json* zero = root.raw("zero_optimization");
  if (zero && zero->is_boolean()) {
    c.zero_optimization = read_zero_bool(root, zero->get<bool>(), diag);
  } else {
    c.zero_optimization = read_zero(root.sub("zero_optimization"), root, diag);
  }
  c.optimizer = read_optimizer(root.sub("optimizer"), diag, options.auto_values_hint);
  c.scheduler = read_scheduler(root.sub("scheduler"), diag, options.auto_values_hint);
  c.activation_checkpointing = read_activation_checkpointing(root.sub("activation_checkpointing"));
  c.pipeline = read_pipeline(root.sub("pipeline"));
  c.tensorboard = read_monitor(root.sub("tensorboard"));
  c.csv_monitor = read_monitor(root.sub("csv_monitor"));
  c.wandb = read_wandb(root.sub("wandb"));
  c.flops_profiler = read_flops_profiler(root.sub("flops_profiler"));
  c.checkpoint = read_checkpoint(root.sub("checkpoint"));
  c.data_types = read_data_types(root.sub("data_types"));
  c.aio = read_aio(root.sub("aio"));
  // flops_profiler turns on DeepSpeed's wall-clock breakdown too.
  c.wall_clock_breakdown = c.wall_clock_breakdown || c.flops_profiler.enabled;

  config::note_ignored_features(root, c, diag);
  root.finish();
  config::announce_unused_keys(c.source, diag);
  c.resolved_keys.assign(diag.resolved.begin(), diag.resolved.end());
  c.warnings = std::move(diag.warnings);
  c.ignored = std::move(diag.ignored);
  return c;
}

}  // namespace

DSConfig load_ds_config(const std::string& path_or_text, const ConfigOptions& options) {
  return parse_ds_config(config::read_config(path_or_text), options);
}

}  // namespace dscpp
