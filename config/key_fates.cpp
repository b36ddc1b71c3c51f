// The key-fate table (key_fates.h) and the start-up announcement of keys not acted on.
#include "dscpp/config/key_fates.h"

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>

namespace dscpp::config {

using nlohmann::json;

namespace {

constexpr KeyFate A(const char* path, const char* test) {
  return {path, Fate::kActedOn, test, nullptr, nullptr, false};
}
constexpr KeyFate U(const char* path, const char* where) {
  return {path, Fate::kActedUntested, where, nullptr, nullptr, false};
}
constexpr KeyFate R(const char* path, const char* what, const char* example) {
  return {path, Fate::kRefused, what, example, nullptr, false};
}
constexpr KeyFate N(const char* path, const char* why, const char* example,
                    const char* inert = nullptr) {
  return {path, Fate::kAnnounced, why, example, inert, false};
}
// Announced by the engine's own start-up list of what it does not implement yet.
constexpr KeyFate E(const char* path, const char* why, const char* example) {
  return {path, Fate::kAnnounced, why, example, nullptr, true};
}

const char* kOracle = "engine.SingleRankOracleStages0To3";
const char* kReduction = "engine.GradientReductionKeysByTheirEffect";
const char* kNoPipe = "dscpp's pipeline engine writes no checkpoints yet";
// DeepSpeed's PipelineModule takes these as arguments and neither engine reads the config's.
const char* kPipeArg = "PipelineOptions decides (DeepSpeed's PipelineModule argument); not read";
const char* kTuning = "a DeepSpeed ZeRO-3 tuning knob; dscpp's stage 3 has no such mechanism";
const char* kFlops = "FlopsProfiler.EngineWritesDeepSpeedsReportAtProfileStep";
const char* kFlopsOptions = "FlopsProfiler.EngineHonoursDepthTopModulesDetailedAndRecomputeFactor";
const char* kWandb = "Weights & Biases needs its Python service: not implemented";
const char* kOffloadTest = "engine.OffloadMatchesNoOffload";
const char* kNvmeTest = "engine.NvmeOffloadMatchesNoOffload";
const char* kNvmeFile = "NvmeFile.RoundTripInBlockSizePiecesThroughAShallowQueue";
const char* kRemoved = "removed from DeepSpeed in 0.19; ignoring it would train another model";
const char* kOn = R"({"enabled": true})";

const std::vector<KeyFate> kTable = {
    // Batch rule and the top-level switches.
    A("train_batch_size", "BatchSize.TrainAndMicroGiveAccumulation"),
    A("sequence_parallel_size", "BatchSize.SequenceParallelRanksShareTheirSamples"),
    A("train_micro_batch_size_per_gpu", "BatchSize.MicroAndAccumulationGiveTrain"),
    A("gradient_accumulation_steps", "EngineCases.StepAppliesOnlyAtTheAccumulationBoundary"),
    A("steps_per_print", "EngineCases.ProgressLinesAndWallClockBreakdown"),
    A("wall_clock_breakdown", "EngineCases.ProgressLinesAndWallClockBreakdown"),
    N("memory_breakdown", "no memory report", "true", "false"),
    A("gradient_clipping", kOracle),
    A("prescale_gradients", kReduction),
    A("gradient_predivide_factor", kReduction),
    A("communication_data_type", kReduction),
    N("zero_allow_untested_optimizer", "dscpp takes any client optimizer", "true"),
    A("zero_force_ds_cpu_optimizer",
      "EngineCases.OffloadRefusesAnOptimizerWithoutCpuKernelsUnlessForcedOff"),
    N("dataloader_drop_last", "the engine builds no data loader from the config", "true"),
    N("allgather_size",
      "the old boolean zero_optimization's bucket size; see allgather_bucket_size", "100"),
    // Precision.
    A("fp16", "EngineCases.Fp16OverflowSkipsTheStepAndFollowsTheScaler"),
    A("fp16.enabled", "EngineCases.Fp16OverflowSkipsTheStepAndFollowsTheScaler"),
    N("fp16.auto_cast", "no autocast of the model's inputs", "true", "false"),
    A("fp16.loss_scale", "precision.AgreesWithDeepSpeedScaler"),
    A("fp16.initial_scale_power", "EngineCases.Fp16OverflowSkipsTheStepAndFollowsTheScaler"),
    A("fp16.loss_scale_window", "LossScaler.GrowthRefillsHysteresis"),
    A("fp16.hysteresis", "LossScaler.HysteresisTwoHalvesOnTheSecondOverflow"),
    A("fp16.consecutive_hysteresis", "LossScaler.ConsecutiveHysteresisRefillsOnEveryGoodStep"),
    A("fp16.min_loss_scale", "LossScaler.HysteresisAtMinimumDoesNotRaise"),
    E("fp16.fp16_master_weights_and_grads", "fp16 master weights are not implemented", "true"),
    A("bf16", "engine.Bf16OracleStages0To3"),
    A("bf16.enabled", "engine.Bf16OracleStages0To3"),
    N("bf16.immediate_grad_update", "gradients accumulate as they do without it", "true", "false"),
    A("bf16.check_grad_overflow", "EngineCases.Bf16OverflowLeavesNoTraceAtEveryStage"),
    E("bf16.bf16_master_weights_and_grads", "bf16 master weights are not implemented", "true"),
    N("bf16.bf16_optimizer_states", "optimizer states stay fp32", "true", "false"),
    // ZeRO.
    A("zero_optimization", kOracle),
    A("zero_optimization.stage", kOracle),
    N("zero_optimization.contiguous_gradients",
      "gradients always live in the flat buffer (contiguous)", "false", "true"),
    A("zero_optimization.reduce_scatter", kOracle),
    A("zero_optimization.reduce_bucket_size",
      "EngineCases.OverlapCommHoldsAtMostTwoBucketsInFlight"),
    N("zero_optimization.use_multi_rank_bucket_allreduce", "buckets are reduced one by one",
      "false", "true"),
    N("zero_optimization.allgather_partitions", "partitions are always all-gathered", "false",
      "true"),
    N("zero_optimization.allgather_bucket_size",
      "parameters are all-gathered per gradient bucket: reduce_bucket_size sets that size", "2e8"),
    A("zero_optimization.overlap_comm", "EngineCases.OverlapCommHoldsAtMostTwoBucketsInFlight"),
    A("zero_optimization.dscpp_deferred_allgather", kOracle),
    N("zero_optimization.load_from_fp32_weights", "checkpoint loading does not read it", "false"),
    N("zero_optimization.elastic_checkpoint", "elastic checkpoints are not written", "true",
      "false"),
    A("zero_optimization.sub_group_size", "EngineCases.SubGroupSizePlacesThePartialOffloadsCut"),
    A("zero_optimization.stage3_prefetch_bucket_size", kOracle),
    A("zero_optimization.stage3_param_persistence_threshold", kOracle),
    A("zero_optimization.stage3_model_persistence_threshold", kOracle),
    A("zero_optimization.stage3_max_live_parameters", kOracle),
    A("zero_optimization.stage3_max_reuse_distance", kOracle),
    A("zero_optimization.stage3_gather_16bit_weights_on_model_save",
      "engine.MultiRankGatheredParametersAndTagValidation"),
    N("zero_optimization.ignore_unused_parameters",
      "dscpp does not look for parameters without a gradient", "false"),
    N("zero_optimization.round_robin_gradients", "gradients are partitioned in order", "true",
      "false"),
    N("zero_optimization.zero_hpz_partition_size", "ZeRO++ hierarchical partitions", "2", "1"),
    N("zero_optimization.zero_quantized_weights", "ZeRO++ quantised weights", "true", "false"),
    N("zero_optimization.zero_quantized_nontrainable_weights", "ZeRO++ quantised weights", "true",
      "false"),
    N("zero_optimization.zero_quantized_gradients", "ZeRO++ quantised gradients", "true", "false"),
    A("zero_optimization.offload_optimizer", kOffloadTest),
    A("zero_optimization.offload_optimizer.device", kOffloadTest),
    A("zero_optimization.offload_optimizer.nvme_path", kNvmeTest),
    A("zero_optimization.offload_optimizer.buffer_count", kNvmeTest),
    U("zero_optimization.offload_optimizer.pin_memory",
      "zero/offload.cpp: the staging slots are page-locked where a GPU is"),
    N("zero_optimization.offload_optimizer.pipeline_read",
      "NVMe offload always reads the next sub-groups ahead (DeepSpeed's pipelined swapper)",
      "false", "true"),
    N("zero_optimization.offload_optimizer.pipeline_write",
      "NVMe offload always writes a sub-group back while the next ones step", "false", "true"),
    N("zero_optimization.offload_optimizer.fast_init",
      "the swap files are written once at start-up either way", "true", "false"),
    A("zero_optimization.offload_optimizer.ratio", "Offload.PartialOffloadStepsLikeNoOffload"),
    N("zero_optimization.offload_optimizer.super_offload", "SuperOffload is not implemented",
      "true", "false"),
    N("zero_optimization.offload_optimizer.cpuadam_cores_perc",
      "the CPU optimizer takes the rank's intra-op threads (OMP_NUM_THREADS)", "0.5"),
    A("zero_optimization.offload_param", kOffloadTest),
    A("zero_optimization.offload_param.device", kOffloadTest),
    A("zero_optimization.offload_param.nvme_path", kNvmeTest),
    A("zero_optimization.offload_param.buffer_count", kNvmeTest),
    A("zero_optimization.offload_param.buffer_size", kNvmeTest),
    A("zero_optimization.offload_param.max_in_cpu", kNvmeTest),
    U("zero_optimization.offload_param.pin_memory",
      "zero/param_store.cpp: the host partition is page-locked where a GPU is"),
    A("zero_optimization.cpu_offload", kOffloadTest),
    A("zero_optimization.cpu_offload_param", kOffloadTest),
    N("zero_optimization.cpu_offload_use_pin_memory",
      "deprecated: offload_optimizer.pin_memory says it", "false"),
    N("zero_optimization.zenflow", "ZenFlow is not implemented", R"({"topk_ratio": 0.1})"),
    R("zero_optimization.mics_shard_size", "MiCS (removed from DeepSpeed in 0.19)", "2"),
    R("zero_optimization.mics_hierarchical_params_gather", "MiCS (removed from DeepSpeed in 0.19)",
      "true"),
    R("zero_optimization.zeropp_loco_param", "LoCo-ZeRO++ (removed from DeepSpeed in 0.19)",
      R"({"err_beta": 0.8})"),
    N("zero_optimization.use_all_reduce_for_fetch_params", kTuning, "true"),
    N("zero_optimization.module_granularity_threshold", kTuning, "100"),
    N("zero_optimization.allgather_sequential", kTuning, "true"),
    N("zero_optimization.legacy_stage1", "dscpp has one stage 1", "true", "false"),
    N("zero_optimization.parameter_alignment", kTuning, "8"),
    N("zero_optimization.memory_efficient_linear", kTuning, "false"),
    N("zero_optimization.pipeline_loading_checkpoint", kTuning, "true"),
    N("zero_optimization.override_module_apply", kTuning, "false"),
    N("zero_optimization.log_trace_cache_warnings", kTuning, "true"),
    N("zero_optimization.enable_sanity_checks", kTuning, "true"),
    N("zero_optimization.save_muon_momentum_buffer_in_memory",
      "Muon's momentum stays in its ZeRO partition", "true"),
    N("zero_optimization.leaf_module", kTuning, R"({"classes": []})"),
    N("zero_optimization.compute_grad_norm", kTuning, "false"),
    // Optimizer and schedule (their params are typed and checked by optim/).
    A("optimizer", "EngineCases.ClientOptimizerAndScheduleTrainAsConfiguredOnesDo"),
    A("optimizer.type", "Optimizer.NamesAreCaseInsensitiveAndDeepSpeedOnlyParamsAreAccepted"),
    A("optimizer.params", "Optimizer.DeepSpeedDefaults"),
    N("optimizer.legacy_fusion", "kernel choice", "true"),
    A("scheduler", "EngineCases.ClientOptimizerAndScheduleTrainAsConfiguredOnesDo"),
    A("scheduler.type", "WarmupDecayLR.DecaysLinearlyToZeroAndResumes"),
    A("scheduler.params", "WarmupLR.StartsAtTheMinimumAndWarmsUpLogarithmically"),
    // Activation checkpointing (read by the model: model_zoo's GPT).
    A("activation_checkpointing", "ActivationCheckpointing.GPTGradientsMatchThePlainPass"),
    N("activation_checkpointing.partition_activations",
      "the model-parallel group has one rank, where DeepSpeed too keeps activations whole", "true",
      "false"),
    N("activation_checkpointing.contiguous_memory_optimization",
      "checkpoints are ordinary allocations", "true", "false"),
    A("activation_checkpointing.cpu_checkpointing", "ActivationCheckpointing.PeakCudaMemoryDrops"),
    A("activation_checkpointing.number_checkpoints",
      "ActivationCheckpointing.GPTGradientsMatchThePlainPass"),
    U("activation_checkpointing.synchronize_checkpoint_boundary",
      "nn/activation_checkpointing.cpp waits for the device"),
    A("activation_checkpointing.profile",
      "ActivationCheckpointing.ProfilePrintsEachCheckpointsTimes"),
    // Pipeline parallelism.
    A("pipeline", "pipe.EngineMatchesOneRank"),
    A("pipeline.stages", "pipe.EngineRefusesStage3AndForwardBackwardStep"),
    A("pipeline.schedule", "pipe.ZeroBubbleMatches1F1B"),
    N("pipeline.partition", kPipeArg, R"("uniform")", R"("best")"),
    N("pipeline.seed_layers", kPipeArg, "true", "false"),
    N("pipeline.activation_checkpoint_interval", kPipeArg, "1", "0"),
    N("pipeline.pipe_partitioned",
      "partitions activations over a tensor-parallel group; dscpp's pipeline has none", "false",
      "true"),
    N("pipeline.grad_partitioned",
      "partitions gradients over a tensor-parallel group; dscpp's pipeline has none", "false",
      "true"),
    N("pipeline.use_reentrant", "dscpp's activation checkpoint is always the reentrant kind",
      "false", "true"),
    // Monitors.
    A("tensorboard", "monitor.TensorBoardAndDeepSpeedReadWhatWeWrite"),
    A("tensorboard.enabled", "MonitorMaster.EachMonitorWritesOnlyWhenItsSectionIsOn"),
    A("tensorboard.output_path", "MonitorLogDir.JoinsOutputPathAndJobNameAsOsPathJoin"),
    A("tensorboard.job_name", "MonitorLogDir.JoinsOutputPathAndJobNameAsOsPathJoin"),
    A("csv_monitor", "EngineCases.CsvMonitorRecordsLossLrAndScaleAtEveryStep"),
    A("csv_monitor.enabled", "MonitorMaster.EachMonitorWritesOnlyWhenItsSectionIsOn"),
    A("csv_monitor.output_path", "MonitorLogDir.JoinsOutputPathAndJobNameAsOsPathJoin"),
    A("csv_monitor.job_name", "MonitorLogDir.JoinsOutputPathAndJobNameAsOsPathJoin"),
    N("wandb", kWandb, kOn),
    N("wandb.enabled", kWandb, "true", "false"),
    N("wandb.group", kWandb, R"("g")"),
    N("wandb.team", kWandb, R"("t")"),
    N("wandb.project", kWandb, R"("p")"),
    N("comet", "Comet needs its Python service: not implemented", kOn),
    N("comms_logger", "the communication logger is not implemented", kOn),
    A("flops_profiler", kFlops),
    A("flops_profiler.enabled", kFlops),
    A("flops_profiler.recompute_fwd_factor", kFlopsOptions),
    A("flops_profiler.profile_step", kFlops),
    A("flops_profiler.module_depth", kFlopsOptions),
    A("flops_profiler.top_modules", kFlopsOptions),
    A("flops_profiler.detailed", kFlopsOptions),
    A("flops_profiler.output_file", kFlops),
    // Checkpoints.
    A("checkpoint", "engine.MultiRankGatheredParametersAndTagValidation"),
    A("checkpoint.tag_validation", "engine.MultiRankGatheredParametersAndTagValidation"),
    A("checkpoint.load_universal", "checkpoint.Universal_theirs"),
    N("checkpoint.use_node_local_storage", "checkpoints go where save_checkpoint says", "true",
      "false"),
    N("checkpoint.parallel_write", "one writer per rank", R"({"pipeline_stage": true})",
      R"({"pipeline_stage": false})"),
    N("checkpoint.parallel_write.pipeline_stage", kNoPipe, "true", "false"),
    N("checkpoint.writer", "one writer per rank", R"({"type": "fast"})"),
    A("data_types", "EngineCases.GradientPartitionTypeFollowsAccumulationAndGradAccumDtype"),
    A("data_types.grad_accum_dtype",
      "EngineCases.GradientPartitionTypeFollowsAccumulationAndGradAccumDtype"),
    N("data_types.param_dtype", "parameters keep the training type", R"("fp32")"),
    N("data_types.buffer_dtype", "buffers keep the model's type", R"("fp32")"),
    N("data_types.keep_in_fp32_modules", "every module takes the training type", R"(["ln"])"),
    // Features whose absence would change what is trained: refused when switched on.
    R("compression_training", kRemoved, R"({"weight_quantization": {}})"),
    R("quantize_training", kRemoved, kOn),
    R("eigenvalue", kRemoved, kOn),
    R("progressive_layer_drop", kRemoved, kOn),
    R("curriculum_learning", kRemoved, kOn),
    R("sparse_attention", kRemoved, R"({"mode": "fixed"})"),
    R("amp", kRemoved, kOn),
    R("sparse_gradients", kRemoved, "true"),
    R("elasticity", kRemoved, kOn),
    R("nebula", kRemoved, kOn),
    R("graph_harvesting", kRemoved, "true"),
    R("data_efficiency", "curriculum learning or random-LTD (data_efficiency with them enabled)",
      R"({"enabled": true, "data_routing": {"enabled": true, "random_ltd": {"enabled": true}}})"),
    R("hybrid_engine", "DeepSpeed's hybrid engine", kOn),
    R("weight_quantization", "weight quantization", R"({"shared_parameters": {"enabled": true}})"),
    R("gradient_allreduce_op", "\"sum\": summed gradients (dscpp averages)", R"("sum")"),
    // Observers, tuners and runtime switches with nothing for dscpp to do.
    N("autotuning", "the autotuner is not implemented", kOn),
    N("datastates", "DataStates checkpointing is not implemented", kOn),
    N("torch_autocast", "no autocast of the model's inputs", kOn),
    N("compile", "no torch.compile (nor deepcompile) in C++", R"({"deepcompile": true})"),
    N("tensor_parallel", "AutoTP is not implemented", R"({"autotp_size": 2})"),
    N("dump_state", "no state dump", "true", "false"),
    N("disable_allgather", "a DeepSpeed debugging switch", "true", "false"),
    N("managed_gradient_accumulation", "the engine accumulates as the config's batch rule says",
      "true"),
    N("disable_python_gc", "there is no Python garbage collector", "1"),
    N("vocabulary_size", "read by DeepSpeed's Megatron integration only", "50304"),
    N("use_data_before_expert_parallelism", "no expert parallelism", "true", "false"),
    N("expert_parallel", "no expert parallelism", R"({"enabled": true})"),
    N("seq_parallel_communication_data_type", "no sequence parallelism", R"("fp16")"),
    N("timers", "the engine's timers follow wall_clock_breakdown",
      R"({"throughput": {"enabled": false}})"),
    N("log_level", "the engine's messages go to stderr", R"("info")"),
    A("aio", kNvmeTest),
    A("aio.block_size", kNvmeFile),
    A("aio.queue_depth", kNvmeFile),
    A("aio.single_submit", "NvmeFile.SingleSubmitRoundTrips"),
    N("aio.intra_op_parallelism",
      "io_uring's kernel workers serve the pieces in parallel; dscpp starts no I/O threads", "2",
      "1"),
    N("aio.overlap_events", "completions are always reaped while the optimizer steps", "false",
      "true"),
    N("aio.use_gds", "no GPUDirect Storage: the swap buffers are in host memory", "true", "false"),
};

// Whether a section is switched off: {"enabled": false} or {"enabled": 0}.
bool switched_off(const json& v) {
  if (!v.is_object() || !v.contains("enabled")) return false;
  const json& e = v["enabled"];
  return (e.is_boolean() && !e.get<bool>()) || (e.is_number() && e.get<double>() == 0);
}

}  // namespace

const std::vector<KeyFate>& key_fates() {
  return kTable;
}

std::string canonical_key(const std::string& path) {
  static const std::map<std::string, std::string> aliases = {
      {"zero_optimization.prefetch_bucket_size", "zero_optimization.stage3_prefetch_bucket_size"},
      {"zero_optimization.param_persistence_threshold",
       "zero_optimization.stage3_param_persistence_threshold"},
      {"zero_optimization.model_persistence_threshold",
       "zero_optimization.stage3_model_persistence_threshold"},
      {"zero_optimization.max_live_parameters", "zero_optimization.stage3_max_live_parameters"},
      {"zero_optimization.max_reuse_distance", "zero_optimization.stage3_max_reuse_distance"},
      {"zero_optimization.gather_16bit_weights_on_model_save",
       "zero_optimization.stage3_gather_16bit_weights_on_model_save"},
      {"zero_optimization.stage3_gather_fp16_weights_on_model_save",
       "zero_optimization.stage3_gather_16bit_weights_on_model_save"},
      {"zero_optimization.stage3_use_all_reduce_for_fetch_params",
       "zero_optimization.use_all_reduce_for_fetch_params"},
      {"zero_optimization.stage3_module_granularity_threshold",
       "zero_optimization.module_granularity_threshold"},
      {"zero_optimization.stage3_allgather_sequential", "zero_optimization.allgather_sequential"},
      {"aio.thread_count", "aio.intra_op_parallelism"},  // DeepSpeed's name before 0.10
  };
  std::string p = path;
  if (p == "bfloat16" || p.rfind("bfloat16.", 0) == 0) p = "bf16" + p.substr(8);
  auto it = aliases.find(p);
  return it == aliases.end() ? p : it->second;
}

const KeyFate* find_key_fate(const std::string& path) {
  static const std::map<std::string, const KeyFate*> index = [] {
    std::map<std::string, const KeyFate*> m;
    for (const auto& f : kTable) m[f.path] = &f;
    return m;
  }();
  auto it = index.find(canonical_key(path));
  return it == index.end() ? nullptr : it->second;
}

void announce_unused_keys(const json& source, Diagnostics& diag) {
  // Whether a line names `path` itself (or, with below, a key under it).
  auto announced = [&](const std::string& path, bool below) {
    for (const auto& line : diag.ignored)
      if (line.find("'" + path + "'") != std::string::npos ||
          (below && line.find("'" + path + ".") != std::string::npos))
        return true;
    return false;
  };
  for (const auto& path : diag.resolved) {
    const KeyFate* f = find_key_fate(path);
    if (!f || f->fate != Fate::kAnnounced || f->by_engine) continue;
    // Walk down to the value, skipping keys inside a section that is switched off or
    // already announced whole.
    const json* v = &source;
    bool skip = false;
    std::string prefix;
    size_t start = 0;
    while (v && !skip) {
      size_t dot = path.find('.', start);
      std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
      prefix = prefix.empty() ? part : prefix + "." + part;
      v = v->is_object() && v->contains(part) ? &(*v)[part] : nullptr;
      if (dot == std::string::npos) break;
      if (v && (switched_off(*v) || announced(prefix, false))) skip = true;
      start = dot + 1;
    }
    if (skip || !v || v->is_null() || is_auto(*v) || switched_off(*v) || announced(path, true))
      continue;
    if (f->inert && *v == json::parse(f->inert)) continue;
    diag.ignored.push_back(fmt::format("'{}': read, not acted on by dscpp ({})", path, f->detail));
  }
}

}  // namespace dscpp::config
