// The key -> ZeRO option table: see zero_options_from.h.
#include "dscpp/runtime/engine/zero_options_from.h"

#include <c10/core/ScalarType.h>

#include <string>

#include "dscpp/config/config_error.h"

namespace dscpp {

namespace {

// The offload sections as the engine acts on them: the optimizer's at stages 1-3, the
// parameters' at stage 3 (elsewhere the config reader or the engine's start-up list announces
// them); null where they do not apply.
const OffloadOptimizerConfig* optimizer_offload(const DSConfig& c) {
  const auto& o = c.zero_optimization.offload_optimizer;
  const bool on = o && (o->device == "cpu" || o->device == "nvme");
  return on && c.zero_optimization.stage >= 1 ? &*o : nullptr;
}
const OffloadOptimizerConfig* optimizer_nvme(const DSConfig& c) {
  const auto* o = optimizer_offload(c);
  return o && o->device == "nvme" ? o : nullptr;
}
const OffloadParamConfig* param_offload(const DSConfig& c) {
  const auto& o = c.zero_optimization.offload_param;
  const bool on = o && (o->device == "cpu" || o->device == "nvme");
  return on && c.zero_optimization.stage == 3 ? &*o : nullptr;
}
const OffloadParamConfig* param_nvme(const DSConfig& c) {
  const auto* o = param_offload(c);
  return o && o->device == "nvme" ? o : nullptr;
}

at::ScalarType training_type(const DSConfig& c) {
  return c.fp16.enabled ? at::kHalf : c.bf16.enabled ? at::kBFloat16 : at::kFloat;
}

std::optional<at::ScalarType> type_named(const std::optional<std::string>& name) {
  if (!name) return std::nullopt;
  if (*name == "fp16") return at::kHalf;
  if (*name == "bf16") return at::kBFloat16;
  return at::kFloat;
}

// Where the reduced gradients accumulate until the step. With no accumulation a 16-bit model
// keeps them in its own type: nothing is summed in it, so fp32 would only double the memory
// (DeepSpeed's stages 1-3 keep them in 16 bits too). With accumulation they stay in fp32
// unless data_types.grad_accum_dtype asks for the training type.
at::ScalarType gradient_partition_type(const DSConfig& c) {
  const at::ScalarType trained = training_type(c);
  const auto& asked = c.data_types.grad_accum_dtype;
  if (!asked) return c.gradient_accumulation_steps == 1 ? trained : at::kFloat;
  const at::ScalarType t = *type_named(asked);
  if (t != at::kFloat && t != trained)
    throw ConfigError("data_types.grad_accum_dtype",
                      "'" + *asked + "' is neither fp32 nor the training type (" +
                          std::string(c10::toString(trained)) + "): expected fp32" +
                          (trained == at::kFloat ? "" : " or the training type"));
  return t;
}

using C = const DSConfig&;
using J = const ZeroJobFacts&;
using S = ZeroSettings&;

const std::vector<ZeroOptionKey> kTable = {
    {"zero_optimization.stage",
     [](C c, J, S s) {
       s.zero.stage = c.zero_optimization.stage;
       s.zero.offload.nvme.stage = c.zero_optimization.stage;  // the swapper's file layout
     }},
    {"zero_optimization.dscpp_deferred_allgather",
     [](C c, J, S s) {
       const auto& z = c.zero_optimization;
       s.zero.defer_allgather = z.dscpp_deferred_allgather && (z.stage == 1 || z.stage == 2);
     }},
    {"zero_optimization.reduce_bucket_size",
     [](C c, J, S s) { s.zero.reduce_bucket_size = c.zero_optimization.reduce_bucket_size; }},
    {"zero_optimization.overlap_comm",
     [](C c, J, S s) { s.zero.overlap_comm = c.zero_optimization.overlap_comm; }},
    {"zero_optimization.reduce_scatter",
     [](C c, J, S s) { s.zero.reduce_scatter = c.zero_optimization.reduce_scatter; }},
    {"prescale_gradients", [](C c, J, S s) { s.zero.prescale_gradients = c.prescale_gradients; }},
    {"gradient_predivide_factor",
     [](C c, J, S s) { s.zero.gradient_predivide_factor = c.gradient_predivide_factor; }},
    {"communication_data_type",
     [](C c, J, S s) { s.zero.communication_data_type = type_named(c.communication_data_type); }},
    {"gradient_clipping", [](C c, J, S s) { s.zero.gradient_clipping = c.gradient_clipping; }},
    // DeepSpeed-Ulysses: each rank of a sequence holds its share of the sequence's loss, so the
    // sequence ranks' gradients are summed and the data ranks' averaged (DeepSpeed's ZeRO 1-2
    // divide by the data-parallel size).
    {"sequence_parallel_size",
     [](C c, J, S s) {
       if (c.sequence_parallel_size > 1) s.zero.average_over = static_cast<int>(c.world_size);
     }},
    // fp16 always checks; bf16 unless told not to.
    {"bf16.check_grad_overflow",
     [](C c, J, S s) {
       s.zero.check_overflow = c.fp16.enabled || (c.bf16.enabled && c.bf16.check_grad_overflow);
     }},
    {"data_types.grad_accum_dtype",
     [](C c, J, S s) { s.zero.grad_dtype = gradient_partition_type(c); }},
    {"gradient_accumulation_steps",
     [](C c, J, S s) { s.zero.accumulates = c.gradient_accumulation_steps > 1; }},
    // Stage 3 by layer.
    {"zero_optimization.stage3_prefetch_bucket_size",
     [](C c, J, S s) {
       s.layer_gather.prefetch_bucket_size = c.zero_optimization.stage3_prefetch_bucket_size;
     }},
    {"zero_optimization.stage3_max_live_parameters",
     [](C c, J, S s) {
       s.layer_gather.max_live_parameters = c.zero_optimization.stage3_max_live_parameters;
     }},
    {"zero_optimization.stage3_max_reuse_distance",
     [](C c, J, S s) {
       s.layer_gather.max_reuse_distance = c.zero_optimization.stage3_max_reuse_distance;
     }},
    {"zero_optimization.stage3_param_persistence_threshold",
     [](C c, J, S s) {
       s.param_persistence_threshold = c.zero_optimization.stage3_param_persistence_threshold;
     }},
    {"zero_optimization.stage3_model_persistence_threshold",
     [](C c, J, S s) {
       s.model_persistence_threshold = c.zero_optimization.stage3_model_persistence_threshold;
     }},
    // ZeRO-Offload of the optimizer (zero/offload.h); with device nvme, ZeRO-Infinity's files
    // under nvme_path (zero/nvme_swap.h).
    {"zero_optimization.offload_optimizer.device",
     [](C c, J job, S s) {
       s.zero.offload.enabled = optimizer_offload(c) != nullptr;
       if (!optimizer_nvme(c)) return;
       s.zero.offload.nvme.enabled = true;
       s.zero.offload.nvme.rank = job.rank;
     }},
    {"zero_optimization.offload_optimizer.nvme_path",
     [](C c, J, S s) {
       if (const auto* o = optimizer_nvme(c)) s.zero.offload.nvme.path = o->nvme_path.value_or("");
     }},
    {"zero_optimization.offload_optimizer.buffer_count",
     [](C c, J, S s) {
       if (const auto* o = optimizer_nvme(c)) s.zero.offload.nvme.buffer_count = o->buffer_count;
     }},
    {"zero_optimization.offload_optimizer.pin_memory",
     [](C c, J job, S s) {
       if (const auto* o = optimizer_offload(c)) s.zero.offload.pin_memory = o->pin_memory;
       if (const auto* o = optimizer_nvme(c))
         s.zero.offload.nvme.pin_memory = o->pin_memory && job.cuda;
     }},
    // Partial offload is stage 3's (DeepSpeed's stages 1-2 never read ratio: the config reader
    // announces it there).
    {"zero_optimization.offload_optimizer.ratio",
     [](C c, J, S s) {
       const auto* o = optimizer_offload(c);
       if (o && c.zero_optimization.stage == 3) s.zero.offload.ratio = o->ratio;
     }},
    {"zero_optimization.sub_group_size",
     [](C c, J, S s) {
       if (optimizer_offload(c)) s.zero.offload.sub_group_size = c.zero_optimization.sub_group_size;
     }},
    // ZeRO-Offload of stage 3's parameters (zero/param_store.h); with device nvme, the chunks
    // past max_in_cpu in files under nvme_path (zero/param_swap.h), through buffer_count host
    // buffers of buffer_size elements.
    {"zero_optimization.offload_param.device",
     [](C c, J job, S s) {
       s.zero.offload_param.enabled = param_offload(c) != nullptr;
       if (!param_nvme(c)) return;
       s.zero.offload_param.nvme.enabled = true;
       s.zero.offload_param.nvme.rank = job.rank;
     }},
    {"zero_optimization.offload_param.nvme_path",
     [](C c, J, S s) {
       if (const auto* o = param_nvme(c))
         s.zero.offload_param.nvme.path = o->nvme_path.value_or("");
     }},
    {"zero_optimization.offload_param.buffer_count",
     [](C c, J, S s) {
       if (const auto* o = param_offload(c)) s.zero.offload_param.buffer_count = o->buffer_count;
       if (const auto* o = param_nvme(c)) s.zero.offload_param.nvme.buffer_count = o->buffer_count;
     }},
    {"zero_optimization.offload_param.buffer_size",
     [](C c, J, S s) {
       if (const auto* o = param_offload(c)) s.zero.offload_param.buffer_size = o->buffer_size;
       if (const auto* o = param_nvme(c)) s.zero.offload_param.nvme.buffer_size = o->buffer_size;
     }},
    {"zero_optimization.offload_param.max_in_cpu",
     [](C c, J, S s) {
       if (const auto* o = param_nvme(c)) s.zero.offload_param.nvme.max_in_cpu = o->max_in_cpu;
     }},
    {"zero_optimization.offload_param.pin_memory",
     [](C c, J job, S s) {
       if (const auto* o = param_offload(c)) s.zero.offload_param.pin_memory = o->pin_memory;
       if (const auto* o = param_nvme(c))
         s.zero.offload_param.nvme.pin_memory = o->pin_memory && job.cuda;
     }},
    // The asynchronous I/O of both NVMe swappers.
    {"aio.block_size",
     [](C c, J, S s) {
       if (optimizer_nvme(c)) s.zero.offload.nvme.aio.block_size = c.aio.block_size;
       if (param_nvme(c)) s.zero.offload_param.nvme.aio.block_size = c.aio.block_size;
     }},
    {"aio.queue_depth",
     [](C c, J, S s) {
       if (optimizer_nvme(c)) s.zero.offload.nvme.aio.queue_depth = c.aio.queue_depth;
       if (param_nvme(c)) s.zero.offload_param.nvme.aio.queue_depth = c.aio.queue_depth;
     }},
    {"aio.single_submit",
     [](C c, J, S s) {
       if (optimizer_nvme(c)) s.zero.offload.nvme.aio.single_submit = c.aio.single_submit;
       if (param_nvme(c)) s.zero.offload_param.nvme.aio.single_submit = c.aio.single_submit;
     }},
};

}  // namespace

const std::vector<ZeroOptionKey>& zero_option_keys() {
  return kTable;
}

ZeroSettings zero_options_from(const DSConfig& config, const ZeroJobFacts& job) {
  ZeroSettings s;
  for (const auto& row : kTable) row.set(config, job, s);
  return s;
}

}  // namespace dscpp
