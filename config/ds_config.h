// The typed ds_config: every key DeepSpeed reads, with DeepSpeed's defaults (taken from
// its code, v0.19.8), resolved for one data-parallel world size. Built by parse_ds_config
// from a file, JSON text or parsed JSON; to_json() writes every effective value back out.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace dscpp {

struct FP16Config {
  bool enabled = false;
  bool auto_cast = false;
  double loss_scale = 0;             // 0: dynamic loss scaling
  int64_t initial_scale_power = 16;  // dynamic: start at 2^initial_scale_power
  int64_t loss_scale_window = 1000;  // good steps before the scale doubles
  int64_t hysteresis = 2;            // overflows tolerated before the scale halves
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1;
  bool fp16_master_weights_and_grads = false;
};

struct BF16Config {
  bool enabled = false;
  bool immediate_grad_update = false;
  bool check_grad_overflow = true;
  bool bf16_master_weights_and_grads = false;
  bool bf16_optimizer_states = false;
};

struct OffloadOptimizerConfig {
  std::string device = "none";           // "none", "cpu" or "nvme"
  std::optional<std::string> nvme_path;  // nvme only
  int64_t buffer_count = 4;
  bool pin_memory = true;
  bool pipeline_read = false;
  bool pipeline_write = false;
  bool fast_init = false;
  double ratio = 1.0;  // share of the optimizer that is offloaded (stage 3 only below 1)
};

struct OffloadParamConfig {
  std::string device = "none";
  std::optional<std::string> nvme_path;
  int64_t buffer_count = 5;
  int64_t buffer_size = 100000000;
  int64_t max_in_cpu = 1000000000;
  bool pin_memory = true;
};

struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  int64_t reduce_bucket_size = 500000000;  // elements per gradient bucket
  bool use_multi_rank_bucket_allreduce = true;
  bool allgather_partitions = true;
  int64_t allgather_bucket_size = 500000000;  // elements per parameter all-gather
  bool overlap_comm = false;                  // DeepSpeed: true only for stage 3 when unset
  // dscpp's own (no DeepSpeed key): stages 1-2 leave the step's all-gathers to the next
  // forward (docs/zero.md).
  bool dscpp_deferred_allgather = false;
  bool load_from_fp32_weights = true;
  bool elastic_checkpoint = false;
  int64_t sub_group_size = 1000000000;
  int64_t stage3_prefetch_bucket_size = 50000000;
  int64_t stage3_param_persistence_threshold = 100000;
  int64_t stage3_model_persistence_threshold = INT64_MAX;
  int64_t stage3_max_live_parameters = 1000000000;
  int64_t stage3_max_reuse_distance = 1000000000;
  bool stage3_gather_16bit_weights_on_model_save = false;
  bool ignore_unused_parameters = true;
  bool round_robin_gradients = false;
  int64_t zero_hpz_partition_size = 1;
  bool zero_quantized_weights = false;
  bool zero_quantized_nontrainable_weights = false;
  bool zero_quantized_gradients = false;
  std::optional<OffloadOptimizerConfig> offload_optimizer;  // absent: no offload
  std::optional<OffloadParamConfig> offload_param;
};

// Optimizer and scheduler params stay JSON here: optim/ types them per algorithm.
struct OptimizerConfig {
  std::string type;  // lower-cased when it is one of DeepSpeed's own optimizers
  nlohmann::json params = nlohmann::json::object();
};

struct SchedulerConfig {
  std::string type;
  nlohmann::json params = nlohmann::json::object();
};

struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool contiguous_memory_optimization = false;
  bool cpu_checkpointing = false;
  std::optional<int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
};

struct PipelineConfig {
  std::string stages = "auto";  // "auto" or a number
  std::string partition = "best";
  bool seed_layers = false;
  int64_t activation_checkpoint_interval = 0;
  bool pipe_partitioned = true;
  bool grad_partitioned = true;
  // dscpp's extension (DeepSpeed runs 1F1B only): "auto" (1F1B, or interleaved where the
  // module has several chunks per stage), "1f1b", "interleaved", "zb-h1" or "zb-v"
  // (pipe/schedule.h).
  std::string schedule = "auto";
};

// tensorboard and csv_monitor (DeepSpeed's monitor sections share this shape).
struct MonitorConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";
};

struct WandbConfig {
  bool enabled = false;
  std::optional<std::string> group;
  std::optional<std::string> team;
  std::string project = "deepspeed";
};

struct FlopsProfilerConfig {
  bool enabled = false;
  double recompute_fwd_factor = 0.0;
  int64_t profile_step = 1;
  int64_t module_depth = -1;
  int64_t top_modules = 1;
  bool detailed = true;
  std::optional<std::string> output_file;
};

struct CheckpointConfig {
  std::string tag_validation = "WARN";  // "IGNORE", "WARN" or "FAIL"
  bool load_universal = false;
  bool use_node_local_storage = false;
  bool parallel_write_pipeline_stage = false;
};

struct DataTypesConfig {
  std::optional<std::string> grad_accum_dtype;  // "fp32", "fp16", "bf16" or unset
};

// DeepSpeed's "aio" section (the asynchronous I/O of NVMe offload). dscpp's io_uring takes
// block_size, queue_depth and single_submit; the others are read and announced.
struct AioConfig {
  int64_t block_size = 1048576;
  int64_t queue_depth = 8;
  int64_t intra_op_parallelism = 1;  // the old name: thread_count
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;
};

struct DSConfig {
  int64_t train_batch_size = 0;
  int64_t train_micro_batch_size_per_gpu = 0;
  int64_t gradient_accumulation_steps = 0;
  int64_t world_size = 1;  // the data-parallel size the batch triple was resolved for
  // DeepSpeed-Ulysses: the ranks that split each sequence (consecutive ranks of the engine's
  // group); the data-parallel size is the engine's group over it (DeepSpeed's batch rule).
  int64_t sequence_parallel_size = 1;
  std::optional<int64_t> steps_per_print;  // unset: DeepSpeed prints no progress lines
  bool wall_clock_breakdown = false;
  bool memory_breakdown = false;
  double gradient_clipping = 1.0;  // 0: no clipping
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  std::optional<std::string> communication_data_type;  // unset: the parameters' type
  bool zero_allow_untested_optimizer = false;
  bool zero_force_ds_cpu_optimizer = true;
  bool dataloader_drop_last = false;
  FP16Config fp16;
  BF16Config bf16;
  ZeroConfig zero_optimization;
  std::optional<OptimizerConfig> optimizer;
  std::optional<SchedulerConfig> scheduler;
  ActivationCheckpointingConfig activation_checkpointing;
  PipelineConfig pipeline;
  MonitorConfig tensorboard;
  MonitorConfig csv_monitor;
  WandbConfig wandb;
  FlopsProfilerConfig flops_profiler;
  CheckpointConfig checkpoint;
  DataTypesConfig data_types;
  AioConfig aio;

  std::vector<std::string> warnings;  // unknown and deprecated keys, odd values accepted
  std::vector<std::string> ignored;   // DeepSpeed features read but not implemented
  // Every key path the reader resolved (present or not): config/key_fates.h gives each a fate.
  std::vector<std::string> resolved_keys;
  nlohmann::json source;  // the config as given, "auto" values filled in
};

struct ConfigOptions {
  // The ranks the engine reduces gradients over: data x sequence_parallel_size; the batch rule
  // takes its quotient by sequence_parallel_size.
  int64_t world_size = 1;
  bool strict = false;  // unknown keys are errors, not warnings
  // Values for "auto": dotted path -> value ("train_micro_batch_size_per_gpu",
  // "optimizer.params.lr"); a value replaces the config's only where it says "auto".
  nlohmann::json auto_values = nlohmann::json::object();
  // How this caller's user gives an "auto" a value, for the error on one left unfilled
  // (dscpp_report: its --auto flag); empty: dscpp::initialize's auto_values.
  std::string auto_values_hint;
};

// Reads a config given as a file path, JSON text, or parsed JSON. Throws ConfigError.
DSConfig parse_ds_config(const nlohmann::json& config, const ConfigOptions& options = {});
DSConfig load_ds_config(const std::string& path_or_text, const ConfigOptions& options = {});

// The ds_config's activation_checkpointing section alone, for a model whose checkpointed layers
// are built before the engine reads the rest (ZeRO-3's and a pipeline's layers). A bad value is
// a ConfigError as parse_ds_config gives it; unknown keys are left to the engine's reading.
ActivationCheckpointingConfig read_activation_checkpointing_section(
    const nlohmann::json& ds_config);

// Every effective value, under DeepSpeed's key names.
nlohmann::json to_json(const DSConfig& config);

}  // namespace dscpp
