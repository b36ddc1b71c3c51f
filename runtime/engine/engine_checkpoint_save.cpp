// EngineCore::save_checkpoint and its parts: DeepSpeed's files (runtime/checkpoint/ds_layout.h)
// filled from the engine's state (engine_checkpoint_load.cpp reads them back). What goes where:
//   model states (rank 0 writes, all read): the module's state_dict, DeepSpeed's bookkeeping
//     keys, the LR schedule, at stage 0 the optimizer in torch's per-parameter layout, and
//     ours: loss scaler, every rank's RNG states (the model-parallel tracker's too), the
//     micro-step count;
//   ZeRO files (stages 1-3, one per rank): DeepSpeed's partition of the fp32 master weights
//     and of the optimizer state, re-mapped from our bucket layout
//     (runtime/checkpoint/ds_partition.h).
// Saving is safe against a crash: each file is renamed into place once complete, and `latest`
// moves only after every rank has written; loading reads every saved partition, so any
// number of ranks loads any other's checkpoint.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "dscpp/error.h"
#include "dscpp/nn/rng_tracker.h"
#include "dscpp/optim/lr_schedules.h"
#include "dscpp/optim/optimizer.h"
#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/ds_partition.h"
#include "dscpp/runtime/checkpoint/moe_layout.h"
#include "dscpp/runtime/checkpoint/recovery_script.h"
#include "dscpp/runtime/checkpoint/save_binding.h"
#include "dscpp/runtime/engine/checkpoint_parts.h"
#include "dscpp/runtime/engine/engine_core.h"
#include "dscpp/runtime/engine/engine_experts.h"
#include "dscpp/runtime/engine/moe_checkpoint.h"
#include "dscpp/runtime/precision/loss_scaler.h"
#include "dscpp/runtime/profiler/engine_profiler.h"
#include "dscpp/zero/gathered_parameters.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp {

using checkpoint::CheckpointError;
using checkpoint::PyValue;
using namespace engine_checkpoint;

namespace {

// The engine's ZeroOptimizers in checkpoint order (EngineCore::checkpoint_partitions).
std::vector<zero::ZeroOptimizer*> checkpointed_zeros(EngineCore& core) {
  std::vector<zero::ZeroOptimizer*> out;
  for (const auto* p : core.checkpoint_partitions()) out.push_back(p->zero);
  return out;
}

// What marks a parameter group as DeepSpeed marks it: the experts' partition, and the two halves
// of a Muon run (muon_run; `muon` the Muon half's partition, null when no dense matrix).
struct GroupMarks {
  EngineExperts* experts = nullptr;
  const zero::ZeroOptimizer* muon = nullptr;
  bool muon_run = false;
};

GroupMarks group_marks_of(EngineCore& core) {
  GroupMarks m;
  m.experts = core.experts();
  for (const auto& p : core.zero_partitions())
    if (std::string(p.name) == "muon") m.muon = p.zero;
  m.muon_run = m.muon || (m.experts && m.experts->zero().optimizer().needs_whole_params());
  return m;
}

// One of torch.optim's param_groups, marked as DeepSpeed marks it: a MoE group ("moe": True, its
// expert group's "name"), or a half of a Muon run ("use_muon" and _muon_param_groups' "name"),
// which DeepSpeed's MuonWithAuxAdam reads back.
PyValue marked_group(const PyValue& settings, const zero::ZeroOptimizer* z,
                     const GroupMarks& marks) {
  PyValue out = settings;
  if (marks.experts && z == &marks.experts->zero()) {
    out.set(PyValue("moe"), PyValue(true));
    out.set(PyValue("name"), PyValue(fmt::format("ep_size_{}", marks.experts->ep_size())));
    // (split_params_into_different_moe_groups_for_optimizer copies the Muon half's keys)
    if (marks.muon_run) out.set(PyValue("use_muon"), PyValue(true));
  } else if (marks.muon_run) {
    const bool muon = z == marks.muon;
    out.set(PyValue("use_muon"), PyValue(muon));
    out.set(PyValue("name"), PyValue(muon ? "muon-params" : "adam-params"));
  }
  return out;
}

// Stage 0: torch.optim's state_dict over the ZeroOptimizers' parameters numbered one after
// the other (each optimizer's flat buffer is whole on every rank of its group), and, under
// 16-bit training, their fp32 master weights in the same order (dscpp_fp32_params).
PyValue stage0_optimizer(const std::vector<zero::ZeroOptimizer*>& zeros, bool keep_fp32,
                         const GroupMarks& marks) {
  PyValue state = PyValue::dict(), groups = PyValue::list(), fp32 = PyValue::list();
  int64_t first = 0;
  for (size_t g = 0; g < zeros.size(); ++g) {
    zero::ZeroOptimizer& z = *zeros[g];
    const auto& params = z.params();
    const auto& layout = z.layout();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& lp = layout.params[i];
      auto per_param = [&](const at::Tensor& flat) {
        return flat.slice(0, lp.offset, lp.offset + lp.numel).view(params[i].sizes()).clone();
      };
      PyValue entry = PyValue::dict();
      entry.set(PyValue("step"),
                PyValue(at::scalar_tensor(static_cast<double>(z.step_count()), at::kFloat)));
      for (const auto& name : z.state_names())
        entry.set(PyValue(name), PyValue(per_param(z.state_partition(name))));
      state.push_entry(PyValue(first + static_cast<int64_t>(i)), std::move(entry));
      if (keep_fp32) fp32.append(PyValue(per_param(z.master_partition())));
    }
    auto& opt = z.optimizer();
    std::vector<std::vector<int64_t>> ids(opt.num_shards());
    for (size_t i = 0; i < params.size(); ++i)
      ids.at(layout.buckets[layout.params[i].bucket].group)
          .push_back(first + static_cast<int64_t>(i));
    const PyValue settings = param_groups(opt, ids);  // (items() of a temporary would dangle)
    for (const auto& one : settings.items()) groups.append(marked_group(one, &z, marks));
    first += static_cast<int64_t>(params.size());
  }
  PyValue optimizer = PyValue::dict();
  optimizer.set(PyValue("state"), std::move(state));
  optimizer.set(PyValue("param_groups"), std::move(groups));
  // 16-bit parameters do not hold the fp32 master weights: keep those too.
  if (keep_fp32) optimizer.set(PyValue("dscpp_fp32_params"), std::move(fp32));
  return optimizer;
}

}  // namespace

void EngineCore::agree(const std::string& local_error, const char* what) {
  at::Tensor flag = at::full({1}, local_error.empty() ? 0.0f : 1.0f,
                             at::TensorOptions().dtype(at::kFloat).device(device_));
  comm::ProcessGroup& g = ckpt_group();
  if (g.size() > 1) g.all_reduce(flag, comm::ReduceOp::kMax).wait();
  if (flag.item<float>() == 0.0f) return;
  if (!local_error.empty()) throw CheckpointError(local_error);
  throw CheckpointError(
      fmt::format("{}: failed on another rank (this is rank {})", what, g.rank()));
}

void EngineCore::check_tag_agrees(const std::string& tag) {
  const std::string& mode = config_.checkpoint.tag_validation;
  comm::ProcessGroup& g = ckpt_group();
  if (mode == "IGNORE" || g.size() == 1) return;
  // Every rank's tag hash, as [h, -h]: one MAX all-reduce gives both the maximum and minimum.
  const double h = static_cast<double>(std::hash<std::string>()(tag) % (1ull << 52));
  at::Tensor t = at::tensor({h, -h}, at::TensorOptions().dtype(at::kDouble)).to(device_);
  g.all_reduce(t, comm::ReduceOp::kMax).wait();
  at::Tensor host = t.cpu();
  if (host[0].item<double>() == -host[1].item<double>()) return;
  const std::string msg = fmt::format(
      "checkpoint tag '{}' (rank {}) is not the same on every rank "
      "(checkpoint.tag_validation is {})",
      tag, g.rank(), mode);
  if (mode == "FAIL") throw CheckpointError(msg);
  std::cerr << "dscpp: warning: " << msg << "\n";
}

std::string EngineCore::shared_save_id() {
  // 16 hex digits as one int64 (bit-exact through the broadcast): rank 0's draw.
  // A pipeline's stages share it too, so that a stage's files of another save are found out.
  comm::ProcessGroup& g = ckpt_group();
  int64_t id = 0;
  if (g.rank() == 0) id = static_cast<int64_t>(std::stoull(checkpoint::new_save_id(), nullptr, 16));
  at::Tensor t = at::full({1}, id, at::TensorOptions().dtype(at::kLong).device(device_));
  if (g.size() > 1) g.broadcast(t, 0).wait();
  return fmt::format("{:016x}", static_cast<uint64_t>(t.cpu().item<int64_t>()));
}

PyValue EngineCore::gather_rng_states() {
  at::Tensor cpu = at::globalContext().defaultGenerator(at::kCPU).get_state();
  at::Tensor cuda;
  if (device_.is_cuda()) cuda = at::globalContext().defaultGenerator(device_).get_state();
  // The model-parallel tracker's named states (nn/rng_tracker.h: a tensor-parallel model's
  // dropout in its split regions), as Megatron's checkpoint keeps its rng_tracker_states; none
  // where nothing seeded the tracker. Every data rank names the same states (one program),
  // but a rank whose tracker differs in size must not break the gather below: then the
  // tracker's states are left out, and a resume draws other masks (rank 0 says so).
  const std::map<std::string, at::Tensor> tracker = nn::get_cuda_rng_tracker().get_states();
  std::vector<at::Tensor> parts{cpu};
  if (cuda.defined()) parts.push_back(cuda);
  int64_t tracker_numel = 0;
  for (const auto& [name, state] : tracker) tracker_numel += state.numel();
  at::Tensor range = at::tensor({tracker_numel, -tracker_numel}, at::kLong).to(device_);
  if (group_->size() > 1) group_->all_reduce(range, comm::ReduceOp::kMax).wait();
  range = range.cpu();
  const bool with_tracker =
      tracker_numel > 0 && range[0].item<int64_t>() == -range[1].item<int64_t>();
  if (tracker_numel > 0 && !with_tracker && group_->rank() == 0)
    std::cerr << "dscpp: save_checkpoint: the data ranks' model-parallel RNG trackers differ "
                 "in size; their states are not saved\n";
  if (with_tracker)
    for (const auto& [name, state] : tracker) parts.push_back(state);
  at::Tensor mine = at::cat(parts);
  const int64_t n = mine.numel(), w = group_->size();
  at::Tensor all = at::empty({w * n}, mine.options().device(device_));
  if (w > 1) {
    group_->all_gather(all, mine.to(device_)).wait();
  } else {
    all.copy_(mine);
  }
  all = all.cpu();
  PyValue out = PyValue::list();
  for (int64_t r = 0; r < w; ++r) {
    at::Tensor row = all.slice(0, r * n, (r + 1) * n);
    int64_t pos = 0;
    auto take = [&](int64_t len) {
      at::Tensor t = row.slice(0, pos, pos + len).clone();
      pos += len;
      return t;
    };
    PyValue s = PyValue::dict();
    s.set(PyValue("cpu"), PyValue(take(cpu.numel())));
    s.set(PyValue("cuda"), cuda.defined() ? PyValue(take(cuda.numel())) : PyValue());
    if (with_tracker) {
      PyValue states = PyValue::dict();
      for (const auto& [name, state] : tracker)
        states.set(PyValue(name), PyValue(take(state.numel())));
      s.set(PyValue("rng_tracker_states"), std::move(states));
    }
    out.append(std::move(s));
  }
  return out;
}

PyValue EngineCore::model_states(const PyValue& client_state, PyValue rng_states) {
  PyValue module = PyValue::ordered_dict();
  // At stage 3 the parameters are empty at rest: their values live in the ZeRO files only,
  // and `module` holds the buffers (as DeepSpeed's stage-3 files do).
  std::set<std::string> partitioned;
  for (const auto& p : zero_set_) partitioned.insert(p.names->begin(), p.names->end());
  for (const auto& [alias, name] : shared_params_) partitioned.insert(alias);
  for (const auto& [name, p] : named_params_())
    if (zero_->stage() < 3 || !partitioned.count(name))
      module.set(PyValue(name), PyValue(p.detach()));
  PyValue buffer_names = PyValue::list();
  for (const auto& [name, b] : named_buffers_()) {
    module.set(PyValue(name), PyValue(b.detach()));
    buffer_names.append(PyValue(name));
  }
  // One ordered dict per parameter group, in the checkpoint's order.
  PyValue shapes_list = PyValue::list();
  for (const auto* p : checkpoint_partitions()) {
    if (EngineExperts* ex = experts(); ex && p->zero == &ex->zero()) continue;  // (below)
    PyValue shapes = PyValue::ordered_dict();
    for (size_t i = 0; i < p->names->size(); ++i)
      shapes.set(PyValue((*p->names)[i]), PyValue::size(p->zero->param_shape(i)));
    shapes_list.append(std::move(shapes));
  }
  PyValue shared = PyValue::dict();
  for (const auto& [alias, name] : shared_params_) shared.set(PyValue(alias), PyValue(name));

  // None at stages 1-2: the optimizer lives in the ZeRO files.
  PyValue optimizer =
      zero_->stage() == 0
          ? stage0_optimizer(checkpointed_zeros(*this), dtype_ != at::kFloat, group_marks_of(*this))
          : PyValue();
  // The expert parameters (ep_size > 1) form a group of their own (moe_relayout.h).
  if (EngineExperts* ex = experts()) {
    PyValue experts = PyValue::ordered_dict();
    for (size_t i = 0; i < ex->names().size(); ++i)
      experts.set(PyValue(ex->names()[i]), PyValue::size(ex->zero().param_shape(i)));
    shapes_list.append(std::move(experts));
  }

  PyValue sd = PyValue::dict();
  sd.set(PyValue("module"), std::move(module));
  sd.set(PyValue("buffer_names"), std::move(buffer_names));
  sd.set(PyValue("optimizer"), std::move(optimizer));
  // DeepSpeed writes param_shapes only at stages 1-3; we always do, so that tools can name
  // the trainable parameters in ZeRO's order at stage 0 too.
  sd.set(PyValue("param_shapes"), std::move(shapes_list));
  sd.set(PyValue("frozen_param_shapes"), PyValue());
  sd.set(PyValue("shared_params"), std::move(shared));
  sd.set(PyValue("frozen_param_fragments"), PyValue());
  sd.set(PyValue("lr_scheduler"),
         scheduler_ ? PyValue::from_json(scheduler_->state_dict()) : PyValue());
  sd.set(PyValue("data_sampler"), PyValue());
  sd.set(PyValue("random_ltd"), PyValue());
  sd.set(PyValue("skipped_steps"), PyValue(skipped_steps_));
  sd.set(PyValue("global_steps"), PyValue(global_steps_));
  sd.set(PyValue("global_samples"), PyValue(global_samples_));
  sd.set(PyValue("dp_world_size"), PyValue(group_->size()));
  sd.set(PyValue("mp_world_size"), PyValue(1));
  PyValue dims = PyValue::dict();
  dims.set(PyValue("pp_degree"), PyValue(1));
  dims.set(PyValue("tp_degree"), PyValue(1));
  sd.set(PyValue("checkpoint_parallel_dimensions"), std::move(dims));
  sd.set(PyValue("ds_config"), PyValue::from_json(config_.source));
  sd.set(PyValue("ds_version"), PyValue(checkpoint::kDsFormatVersion));
  sd.set(PyValue("dscpp_version"), PyValue(DSCPP_VERSION));
  sd.set(PyValue("dscpp_zero_stage"), PyValue(zero_->stage()));
  sd.set(PyValue("dscpp_loss_scaler"), PyValue::from_json(scaler_->state_dict()));
  sd.set(PyValue("dscpp_rng_states"), std::move(rng_states));
  sd.set(PyValue("dscpp_micro_steps"), PyValue(micro_steps_));
  // The order each partition was laid out in (its first backward's), for a resume to take
  // before its own first backward (ZeroOptimizer::build_in_order).
  PyValue orders = PyValue::dict();
  for (const auto& p : zero_set_) {
    std::vector<PyValue> order;
    for (int i : p.zero->layout_order()) order.emplace_back(i);
    if (!order.empty()) orders.set(PyValue(p.name), PyValue::list(std::move(order)));
  }
  sd.set(PyValue("dscpp_layout_orders"), std::move(orders));
  for (size_t i = 0; i < client_state.size(); ++i)
    sd.set(client_state.keys()[i], client_state.values()[i]);
  return sd;
}

PyValue EngineCore::zero_states() {
  const bool stage3 = zero_->stage() >= 3;
  // One group per ZeroOptimizer: the dense one over the data group, the experts' (ep_size > 1)
  // over their expert-data group, as DeepSpeed's ZeRO 1-2 partitions a MoE param group over
  // its real_dp_process_group.
  std::vector<std::pair<zero::ZeroOptimizer*, comm::ProcessGroup*>> zeros;
  for (const auto* p : checkpoint_partitions()) zeros.emplace_back(p->zero, p->group);
  PyValue state = PyValue::dict(), groups = PyValue::list(), fp32 = PyValue::list();
  PyValue group_paddings = PyValue::list(), alignment = PyValue::list(), counts = PyValue::list();
  for (size_t g = 0; g < zeros.size(); ++g) {
    zero::ZeroOptimizer& z = *zeros[g].first;
    comm::ProcessGroup& over = *zeros[g].second;
    auto& opt = z.optimizer();
    const auto& layout = z.layout();
    const auto ds = ds_layout(z.stage(), numels_of(z), over.size());
    const int64_t held = ds.held(over.rank());
    PyValue entry = PyValue::dict();
    entry.set(PyValue("step"),
              PyValue(at::scalar_tensor(static_cast<double>(z.step_count()), at::kFloat)));
    for (const auto& name : z.state_names()) {
      const at::Tensor t = z.state_partition(name);
      // Muon's momentum in DeepSpeed's ZeRO 1-2 form: each matrix of the partition whole (the
      // Muon half's partition and, in a Muon run, the experts').
      if (z.optimizer().needs_whole_params() && !stage3 && name == "momentum_buffer") {
        entry.set(PyValue(name), PyValue(checkpoint::to_ds_whole_params(layout, ds, t, over)));
        continue;
      }
      // DeepSpeed's (rigid) optimizer state covers the whole partition, padding included.
      at::Tensor full = at::zeros({ds.partition}, at::kFloat);
      full.slice(0, 0, held).copy_(checkpoint::to_ds_partition(layout, ds, t, over));
      entry.set(PyValue(name), PyValue(full));
    }
    state.push_entry(PyValue(static_cast<int64_t>(g)), std::move(entry));
    // One flat partition holds each optimizer's groups (the groups' settings follow, each
    // naming it).
    PyValue settings = param_groups(
        opt, std::vector<std::vector<int64_t>>(opt.num_shards(), {static_cast<int64_t>(g)}));
    for (const auto& one : settings.items())
      groups.append(marked_group(one, &z, group_marks_of(*this)));
    fp32.append(PyValue(checkpoint::to_ds_partition(layout, ds, z.master_partition(), over)));
    group_paddings.append(PyValue(ds.partition - held));
    PyValue paddings = PyValue::list();
    for (size_t i = 0; i < z.params().size(); ++i) paddings.append(PyValue(0));
    alignment.append(std::move(paddings));
    counts.append(PyValue(over.size()));
  }
  PyValue base = PyValue::dict();
  base.set(PyValue("state"), std::move(state));
  base.set(PyValue("param_groups"), std::move(groups));

  PyValue osd = PyValue::dict();
  osd.set(PyValue("dynamic_loss_scale"), PyValue(scaler_->dynamic()));
  osd.set(PyValue("overflow"), PyValue(false));
  osd.set(PyValue("clip_grad"), PyValue(config_.gradient_clipping));
  // Stage 3's keys differ: DeepSpeed's DeepSpeedZeroOptimizer_Stage3.state_dict().
  osd.set(PyValue(stage3 ? "optimizer_state_dict" : "base_optimizer_state"), std::move(base));
  osd.set(PyValue(stage3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups"),
          std::move(fp32));
  osd.set(PyValue("zero_stage"), PyValue(zero_->stage()));
  if (stage3) {
    osd.set(PyValue("partition_count"), PyValue(group_->size()));
  } else {
    osd.set(PyValue("group_paddings"), std::move(group_paddings));
    osd.set(PyValue("param_alignment_paddings"), std::move(alignment));
    osd.set(PyValue("partition_count"), std::move(counts));
  }
  osd.set(PyValue("ds_version"), PyValue(checkpoint::kDsFormatVersion));

  PyValue file = PyValue::dict();
  file.set(PyValue("optimizer_state_dict"), std::move(osd));
  file.set(PyValue("ds_config"), PyValue::from_json(config_.source));
  file.set(PyValue("ds_version"), PyValue(checkpoint::kDsFormatVersion));
  return file;
}

void EngineCore::save_checkpoint(const std::string& save_dir, const std::string& tag_in,
                                 const PyValue& client_state) {
  const std::string tag = tag_in.empty() ? "global_step" + std::to_string(global_steps_) : tag_in;
  checkpoint::check_tag(tag);
  zero_->wait_all_published();  // the module's parameters are saved as they are
  if (!client_state.is_dict()) throw dscpp::Error("save_checkpoint: client_state must be a dict");
  for (const auto& k : client_state.keys()) {
    const auto& reserved = checkpoint::engine_state_keys();
    if (k.is_string() &&
        std::find(reserved.begin(), reserved.end(), k.as_string()) != reserved.end())
      throw dscpp::Error("save_checkpoint: client_state key '" + k.as_string() +
                         "' is one the engine writes itself");
  }
  check_tag_agrees(tag);
  // MoE: DeepSpeed's layout (runtime/checkpoint/moe_layout.h), expert tensors per global expert.
  const Experts experts = client_.expert_params ? *client_.expert_params : Experts{};
  const int64_t ep = experts.empty() ? 1 : experts.begin()->second.ep_size;
  if (!experts.empty() && zero_->stage() >= 3 && ckpt_layout_.model_states_path)
    throw dscpp::Error(
        "save_checkpoint: experts with tensor parallelism at ZeRO stage 3 (the tensor-parallel "
        "MoE layout is written at ZeRO stages 0-2)");
  EngineExperts* const own = this->experts();  // the experts' ZeroOptimizer (ep_size > 1)
  if (ep > 1 && !own)
    throw dscpp::Error(fmt::format(
        "save_checkpoint: expert parameters at ep_size {}, but the engine holds none of its own "
        "(InitArgs::expert_params named none with ep_size > 1)",
        ep));
  if (ep > 1 && own->ep_rank() != group_->rank() % ep)
    throw dscpp::Error(fmt::format(
        "save_checkpoint: data rank {} has expert-parallel rank {}; DeepSpeed's MoE layout "
        "(consecutive runs of ep_size {} data ranks, comm::new_expert_groups) needs {}",
        group_->rank(), own->ep_rank(), ep, group_->rank() % ep));
  if (own) own->zero().wait_all_published();
  at::NoGradGuard no_grad;
  // The collective parts first, on every rank, before any file is touched.
  PyValue rng = gather_rng_states();
  PyValue zero_file = zero_->stage() >= 1 ? zero_states() : PyValue();
  // Every file of this save carries rank 0's save id (checkpoint/save_binding.h).
  checkpoint::SaveBinding binding{shared_save_id(), group_->rank(), group_->size(), global_steps_};
  if (!zero_file.is_none()) checkpoint::write_binding(zero_file, binding);
  // Stage 3: the expert files hold whole experts, so their partitions are gathered (only
  // theirs: the experts' own ZeroOptimizer at ep_size > 1, else the dense one's buckets that
  // hold them), collectively on every rank, for the writers below.
  std::optional<zero::GatheredParameters> gathered_experts;
  if (!experts.empty() && zero_->stage() >= 3) {
    if (own) {
      gathered_experts.emplace(own->zero());
    } else {
      std::vector<at::Tensor> tensors;
      for (const auto& [name, p] : named_params_())
        if (experts.count(name)) tensors.push_back(p);
      gathered_experts.emplace(*zero_, *group_, std::move(tensors));
    }
  }
  auto bound = [&](PyValue model) {
    checkpoint::write_binding(model, binding);
    return model;
  };
  std::string error;
  try {
    checkpoint::make_tag_dir(save_dir, tag);
    const bool bf16 = dtype_ == at::kBFloat16;
    // Each expert-parallel rank's experts, by its expert-data rank 0 (DeepSpeed's writer);
    // at stage 0 also its whole optimizer (the dense parameters', then its experts').
    if (!experts.empty() && expert_data_rank(group_->rank(), ep) == 0) {
      std::map<std::string, at::Tensor> values;
      for (const auto& [name, p] : named_params_()) values.emplace(name, p);
      checkpoint::save_expert_files(
          save_dir, tag, experts, [&](const std::string& name) { return values.at(name); },
          ckpt_layout_.mp_rank);
      if (zero_->stage() == 0) {
        PyValue expp = PyValue::dict();
        expp.set(PyValue("optimizer"),
                 stage0_optimizer(checkpointed_zeros(*this), dtype_ != at::kFloat,
                                  group_marks_of(*this)));
        checkpoint::save_torch_file(bound(std::move(expp)),
                                    checkpoint::expp_optim_states_path(
                                        save_dir, tag, group_->rank() % ep, ckpt_layout_.mp_rank));
      }
    }
    if (zero_->stage() >= 1)
      checkpoint::save_torch_file(
          zero_file, ckpt_layout_.zero_states_path
                         ? ckpt_layout_.zero_states_path(save_dir, tag, group_->rank(), bf16)
                         : checkpoint::zero_states_path(save_dir, tag, group_->rank(), bf16));
    // Stage 3: every rank writes its own model-states file, as DeepSpeed does; a layout of
    // its own (tensor parallelism: mp_rank_XX) keeps its one file per data group.
    if (zero_->stage() >= 3 && !ckpt_layout_.model_states_path) {
      PyValue model = model_states(client_state, std::move(rng));
      if (!experts.empty()) to_moe_model_states(model, experts);
      checkpoint::save_torch_file(bound(std::move(model)), checkpoint::zero_model_states_path(
                                                               save_dir, tag, group_->rank()));
    } else if (group_->rank() == 0) {
      PyValue model = model_states(client_state, std::move(rng));
      if (!experts.empty()) to_moe_model_states(model, experts);
      if (ckpt_layout_.before_model_states) ckpt_layout_.before_model_states(save_dir, tag, model);
      checkpoint::save_torch_file(bound(std::move(model)),
                                  ckpt_layout_.model_states_path
                                      ? ckpt_layout_.model_states_path(save_dir, tag)
                                      : checkpoint::model_states_path(save_dir, tag));
    }
  } catch (const std::exception& e) {
    error = fmt::format("save_checkpoint '{}' (rank {}): {}", checkpoint::tag_dir(save_dir, tag),
                        group_->rank(), e.what());
  }
  gathered_experts.reset();  // back to rest
  agree(error, "save_checkpoint");
  // Only now is the tag complete on every rank: a crash before this line leaves `latest`
  // naming the previous checkpoint.
  error.clear();
  if (ckpt_group().rank() == 0) {
    try {
      checkpoint::write_latest(save_dir, tag);
    } catch (const std::exception& e) {
      error = e.what();
    }
    // As DeepSpeed's: the folder carries its consolidation script (ours, torch only). The
    // checkpoint is complete without it, so a failure to write it only warns.
    try {
      checkpoint::write_zero_to_fp32_script(save_dir);
    } catch (const std::exception& e) {
      std::cerr << "dscpp: warning: " << e.what() << "\n";
    }
  }
  agree(error, "save_checkpoint");
}

}  // namespace dscpp
