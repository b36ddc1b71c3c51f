// to_json: every effective value of a DSConfig under DeepSpeed's key names (what
// `dscpp_report --config` prints, and what checkpoints record as ds_config).
#include <nlohmann/json.hpp>

#include "dscpp/config/ds_config.h"

namespace dscpp {

using nlohmann::json;

namespace {

template <typename T>
json opt(const std::optional<T>& v) {
  return v ? json(*v) : json(nullptr);
}

json monitor(const MonitorConfig& m) {
  return {{"enabled", m.enabled}, {"output_path", m.output_path}, {"job_name", m.job_name}};
}

}  // namespace

json to_json(const DSConfig& c) {
  const ZeroConfig& z = c.zero_optimization;
  json zero = {
      {"stage", z.stage},
      {"contiguous_gradients", z.contiguous_gradients},
      {"reduce_scatter", z.reduce_scatter},
      {"reduce_bucket_size", z.reduce_bucket_size},
      {"use_multi_rank_bucket_allreduce", z.use_multi_rank_bucket_allreduce},
      {"allgather_partitions", z.allgather_partitions},
      {"allgather_bucket_size", z.allgather_bucket_size},
      {"overlap_comm", z.overlap_comm},
      {"load_from_fp32_weights", z.load_from_fp32_weights},
      {"elastic_checkpoint", z.elastic_checkpoint},
      {"sub_group_size", z.sub_group_size},
      {"stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size},
      {"stage3_param_persistence_threshold", z.stage3_param_persistence_threshold},
      {"stage3_model_persistence_threshold", z.stage3_model_persistence_threshold},
      {"stage3_max_live_parameters", z.stage3_max_live_parameters},
      {"stage3_max_reuse_distance", z.stage3_max_reuse_distance},
      {"stage3_gather_16bit_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save},
      {"ignore_unused_parameters", z.ignore_unused_parameters},
      {"round_robin_gradients", z.round_robin_gradients},
      {"zero_hpz_partition_size", z.zero_hpz_partition_size},
      {"zero_quantized_weights", z.zero_quantized_weights},
      {"zero_quantized_nontrainable_weights", z.zero_quantized_nontrainable_weights},
      {"zero_quantized_gradients", z.zero_quantized_gradients},
      {"offload_optimizer", nullptr},
      {"offload_param", nullptr},
  };
  if (const auto& o = z.offload_optimizer)
    zero["offload_optimizer"] = {{"device", o->device},
                                 {"nvme_path", opt(o->nvme_path)},
                                 {"buffer_count", o->buffer_count},
                                 {"pin_memory", o->pin_memory},
                                 {"pipeline_read", o->pipeline_read},
                                 {"pipeline_write", o->pipeline_write},
                                 {"fast_init", o->fast_init},
                                 {"ratio", o->ratio}};
  if (const auto& o = z.offload_param)
    zero["offload_param"] = {{"device", o->device},
                             {"nvme_path", opt(o->nvme_path)},
                             {"buffer_count", o->buffer_count},
                             {"buffer_size", o->buffer_size},
                             {"max_in_cpu", o->max_in_cpu},
                             {"pin_memory", o->pin_memory}};
  const auto& f = c.fp16;
  const auto& b = c.bf16;
  const auto& ac = c.activation_checkpointing;
  const auto& p = c.pipeline;
  const auto& fp = c.flops_profiler;
  json out = {
      {"train_batch_size", c.train_batch_size},
      {"train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu},
      {"gradient_accumulation_steps", c.gradient_accumulation_steps},
      {"steps_per_print", opt(c.steps_per_print)},
      {"wall_clock_breakdown", c.wall_clock_breakdown},
      {"memory_breakdown", c.memory_breakdown},
      {"gradient_clipping", c.gradient_clipping},
      {"prescale_gradients", c.prescale_gradients},
      {"gradient_predivide_factor", c.gradient_predivide_factor},
      {"communication_data_type", opt(c.communication_data_type)},
      {"zero_allow_untested_optimizer", c.zero_allow_untested_optimizer},
      {"zero_force_ds_cpu_optimizer", c.zero_force_ds_cpu_optimizer},
      {"dataloader_drop_last", c.dataloader_drop_last},
      {"fp16",
       {{"enabled", f.enabled},
        {"auto_cast", f.auto_cast},
        {"loss_scale", f.loss_scale},
        {"initial_scale_power", f.initial_scale_power},
        {"loss_scale_window", f.loss_scale_window},
        {"hysteresis", f.hysteresis},
        {"consecutive_hysteresis", f.consecutive_hysteresis},
        {"min_loss_scale", f.min_loss_scale},
        {"fp16_master_weights_and_grads", f.fp16_master_weights_and_grads}}},
      {"bf16",
       {{"enabled", b.enabled},
        {"immediate_grad_update", b.immediate_grad_update},
        {"check_grad_overflow", b.check_grad_overflow},
        {"bf16_master_weights_and_grads", b.bf16_master_weights_and_grads},
        {"bf16_optimizer_states", b.bf16_optimizer_states}}},
      {"zero_optimization", zero},
      {"optimizer", c.optimizer ? json{{"type", c.optimizer->type}, {"params", c.optimizer->params}}
                                : json(nullptr)},
      {"scheduler", c.scheduler ? json{{"type", c.scheduler->type}, {"params", c.scheduler->params}}
                                : json(nullptr)},
      {"activation_checkpointing",
       {{"partition_activations", ac.partition_activations},
        {"contiguous_memory_optimization", ac.contiguous_memory_optimization},
        {"cpu_checkpointing", ac.cpu_checkpointing},
        {"number_checkpoints", opt(ac.number_checkpoints)},
        {"synchronize_checkpoint_boundary", ac.synchronize_checkpoint_boundary},
        {"profile", ac.profile}}},
      {"pipeline",
       {{"stages", p.stages},
        {"partition", p.partition},
        {"seed_layers", p.seed_layers},
        {"activation_checkpoint_interval", p.activation_checkpoint_interval},
        {"pipe_partitioned", p.pipe_partitioned},
        {"grad_partitioned", p.grad_partitioned},
        {"schedule", p.schedule}}},
      {"tensorboard", monitor(c.tensorboard)},
      {"csv_monitor", monitor(c.csv_monitor)},
      {"wandb",
       {{"enabled", c.wandb.enabled},
        {"group", opt(c.wandb.group)},
        {"team", opt(c.wandb.team)},
        {"project", c.wandb.project}}},
      {"flops_profiler",
       {{"enabled", fp.enabled},
        {"recompute_fwd_factor", fp.recompute_fwd_factor},
        {"profile_step", fp.profile_step},
        {"module_depth", fp.module_depth},
        {"top_modules", fp.top_modules},
        {"detailed", fp.detailed},
        {"output_file", opt(fp.output_file)}}},
      {"checkpoint",
       {{"tag_validation", c.checkpoint.tag_validation},
        {"load_universal", c.checkpoint.load_universal},
        {"use_node_local_storage", c.checkpoint.use_node_local_storage},
        {"parallel_write", {{"pipeline_stage", c.checkpoint.parallel_write_pipeline_stage}}}}},
      {"data_types", {{"grad_accum_dtype", opt(c.data_types.grad_accum_dtype)}}},
      {"aio",
       {{"block_size", c.aio.block_size},
        {"queue_depth", c.aio.queue_depth},
        {"intra_op_parallelism", c.aio.intra_op_parallelism},
        {"single_submit", c.aio.single_submit},
        {"overlap_events", c.aio.overlap_events},
        {"use_gds", c.aio.use_gds}}},
  };
  return out;
}

}  // namespace dscpp
