// EngineCore::save_checkpoint / load_checkpoint: DeepSpeed's files (runtime/checkpoint/
// ds_layout.h) filled from, and loaded into, the engine's state. What goes where:
//   model states (rank 0 writes, all read): the module's state_dict, DeepSpeed's bookkeeping
//     keys, the LR schedule, at stage 0 the optimizer in torch's per-parameter layout, and
//     ours: loss scaler, every rank's RNG states, the micro-step count;
//   ZeRO files (stages 1-2, one per rank): DeepSpeed's partition of the fp32 master weights
//     and of the optimizer state, re-mapped from our bucket layout (zero/ds_partition.h).
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
#include <set>

#include "optim/lr_schedules.h"
#include "optim/optimizer.h"
#include "runtime/checkpoint/ds_layout.h"
#include "runtime/engine/engine_core.h"
#include "runtime/precision/loss_scaler.h"
#include "zero/ds_partition.h"
#include "zero/zero_optimizer.h"

namespace dscpp {

using checkpoint::CheckpointError;
using checkpoint::PyValue;

namespace {

constexpr size_t kListed = 8;  // names listed in an error before "and N more"

std::string list_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < kListed; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > kListed) out += fmt::format(" and {} more", names.size() - kListed);
  return out;
}

const PyValue& need(const PyValue& dict, const char* key, const std::string& path) {
  if (!dict.is_dict()) throw CheckpointError("'" + path + "' does not hold a dict where expected");
  const PyValue* v = dict.find(PyValue(key));
  if (!v) throw CheckpointError("'" + path + "' has no '" + key + "' entry");
  return *v;
}

int64_t step_of(const PyValue& v) {
  return v.is_tensor() ? static_cast<int64_t>(v.as_tensor().item<double>()) : v.as_int();
}

// torch.optim's param_groups: each group's settings and the indices of its parameters
// (ids[g]).
PyValue param_groups(const optim::Optimizer& opt, const std::vector<std::vector<int64_t>>& ids) {
  PyValue groups = PyValue::list();
  for (int g = 0; g < opt.num_shards(); ++g) {
    PyValue group = PyValue::from_json(opt.hyper(g));
    PyValue list = PyValue::list();
    for (int64_t i : ids.at(g)) list.append(PyValue(i));
    group.set(PyValue("params"), list);
    groups.append(std::move(group));
  }
  return groups;
}

std::vector<int64_t> numels_of(const zero::ZeroOptimizer& zero) {
  std::vector<int64_t> n;
  for (const auto& p : zero.layout().params) n.push_back(p.numel);
  return n;
}

// DeepSpeed's layout of the saved partitions: stage 3 partitions each parameter on its own.
zero::DsLayout ds_layout(int stage, const std::vector<int64_t>& numels, int world,
                         const std::vector<int64_t>& paddings = {}) {
  return stage >= 3 ? zero::DsLayout::build_stage3(numels, world)
                    : zero::DsLayout::build(numels, world, paddings);
}

}  // namespace

void EngineCore::agree(const std::string& local_error, const char* what) {
  at::Tensor flag = at::full({1}, local_error.empty() ? 0.0f : 1.0f,
                             at::TensorOptions().dtype(at::kFloat).device(device_));
  if (group_->size() > 1) group_->all_reduce(flag, comm::ReduceOp::kMax).wait();
  if (flag.item<float>() == 0.0f) return;
  if (!local_error.empty()) throw CheckpointError(local_error);
  throw CheckpointError(
      fmt::format("{}: failed on another rank (this is rank {})", what, group_->rank()));
}

void EngineCore::check_tag_agrees(const std::string& tag) {
  const std::string& mode = config_.checkpoint.tag_validation;
  if (mode == "IGNORE" || group_->size() == 1) return;
  // Every rank's tag hash, as [h, -h]: one MAX all-reduce gives both the maximum and minimum.
  const double h = static_cast<double>(std::hash<std::string>()(tag) % (1ull << 52));
  at::Tensor t = at::tensor({h, -h}, at::TensorOptions().dtype(at::kDouble)).to(device_);
  group_->all_reduce(t, comm::ReduceOp::kMax).wait();
  at::Tensor host = t.cpu();
  if (host[0].item<double>() == -host[1].item<double>()) return;
  const std::string msg = fmt::format(
      "checkpoint tag '{}' (rank {}) is not the same on every rank "
      "(checkpoint.tag_validation is {})",
      tag, group_->rank(), mode);
  if (mode == "FAIL") throw CheckpointError(msg);
  std::cerr << "dscpp: warning: " << msg << "\n";
}

PyValue EngineCore::gather_rng_states() {
  at::Tensor cpu = at::globalContext().defaultGenerator(at::kCPU).get_state();
  at::Tensor cuda;
  if (device_.is_cuda()) cuda = at::globalContext().defaultGenerator(device_).get_state();
  at::Tensor mine = cuda.defined() ? at::cat({cpu, cuda}) : cpu;
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
    PyValue s = PyValue::dict();
    s.set(PyValue("cpu"), PyValue(row.slice(0, 0, cpu.numel()).clone()));
    s.set(PyValue("cuda"),
          cuda.defined() ? PyValue(row.slice(0, cpu.numel(), n).clone()) : PyValue());
    out.append(std::move(s));
  }
  return out;
}

void EngineCore::restore_rng_state(const PyValue& states) {
  if (!states.is_list() || states.size() != static_cast<size_t>(group_->size())) {
    if (group_->rank() == 0)
      std::cerr << "dscpp: the checkpoint's random-number states are for another number of "
                   "ranks; they are not restored\n";
    return;
  }
  const PyValue& mine = states.items()[group_->rank()];
  // Generator is a handle: a copy sets the default generator's own state.
  at::Generator cpu = at::globalContext().defaultGenerator(at::kCPU);
  cpu.set_state(mine.at(PyValue("cpu")).as_tensor());
  const PyValue& cuda = mine.at(PyValue("cuda"));
  if (device_.is_cuda() && cuda.is_tensor()) {
    at::Generator gen = at::globalContext().defaultGenerator(device_);
    gen.set_state(cuda.as_tensor());
  }
}

PyValue EngineCore::model_states(const PyValue& client_state, PyValue rng_states) {
  PyValue module = PyValue::ordered_dict();
  // At stage 3 the parameters are empty at rest: their values live in the ZeRO files only,
  // and `module` holds the buffers (as DeepSpeed's stage-3 files do).
  std::set<std::string> partitioned(param_names_.begin(), param_names_.end());
  for (const auto& [alias, name] : shared_params_) partitioned.insert(alias);
  for (const auto& [name, p] : named_params_())
    if (zero_->stage() < 3 || !partitioned.count(name))
      module.set(PyValue(name), PyValue(p.detach()));
  PyValue buffer_names = PyValue::list();
  for (const auto& [name, b] : named_buffers_()) {
    module.set(PyValue(name), PyValue(b.detach()));
    buffer_names.append(PyValue(name));
  }
  const auto& params = zero_->params();
  PyValue shapes = PyValue::ordered_dict();
  for (size_t i = 0; i < params.size(); ++i)
    shapes.set(PyValue(param_names_[i]), PyValue::size(zero_->param_shape(i)));
  PyValue shared = PyValue::dict();
  for (const auto& [alias, name] : shared_params_) shared.set(PyValue(alias), PyValue(name));

  PyValue optimizer;  // None: at stages 1-2 the optimizer lives in the ZeRO files
  if (zero_->stage() == 0) {
    // torch.optim's state_dict: per-parameter state keyed by index, one group.
    auto& opt = zero_->optimizer();
    const auto& layout = zero_->layout();
    PyValue state = PyValue::dict();
    PyValue fp32 = PyValue::list();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& lp = layout.params[i];
      auto per_param = [&](const at::Tensor& flat) {
        return flat.slice(0, lp.offset, lp.offset + lp.numel).view(params[i].sizes()).clone();
      };
      PyValue entry = PyValue::dict();
      entry.set(PyValue("step"),
                PyValue(at::scalar_tensor(static_cast<double>(zero_->step_count()), at::kFloat)));
      for (const auto& name : zero_->state_names())
        entry.set(PyValue(name), PyValue(per_param(zero_->state_partition(name))));
      state.push_entry(PyValue(static_cast<int64_t>(i)), std::move(entry));
      if (dtype_ != at::kFloat) fp32.append(PyValue(per_param(zero_->master_partition())));
    }
    optimizer = PyValue::dict();
    optimizer.set(PyValue("state"), std::move(state));
    std::vector<std::vector<int64_t>> ids(opt.num_shards());
    for (size_t i = 0; i < params.size(); ++i)
      ids.at(layout.buckets[layout.params[i].bucket].group).push_back(static_cast<int64_t>(i));
    optimizer.set(PyValue("param_groups"), param_groups(opt, ids));
    // 16-bit parameters do not hold the fp32 master weights: keep those too.
    if (dtype_ != at::kFloat) optimizer.set(PyValue("dscpp_fp32_params"), std::move(fp32));
  }

  PyValue sd = PyValue::dict();
  sd.set(PyValue("module"), std::move(module));
  sd.set(PyValue("buffer_names"), std::move(buffer_names));
  sd.set(PyValue("optimizer"), std::move(optimizer));
  // DeepSpeed writes param_shapes only at stages 1-3; we always do, so that tools can name
  // the trainable parameters in ZeRO's order at stage 0 too.
  sd.set(PyValue("param_shapes"), PyValue::list({std::move(shapes)}));
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
  for (size_t i = 0; i < client_state.size(); ++i)
    sd.set(client_state.keys()[i], client_state.values()[i]);
  return sd;
}

PyValue EngineCore::zero_states() {
  auto& opt = zero_->optimizer();
  const auto& layout = zero_->layout();
  const bool stage3 = zero_->stage() >= 3;
  const auto ds = ds_layout(zero_->stage(), numels_of(*zero_), group_->size());
  const int r = group_->rank();
  const int64_t held = ds.held(r);

  PyValue entry = PyValue::dict();
  entry.set(PyValue("step"),
            PyValue(at::scalar_tensor(static_cast<double>(zero_->step_count()), at::kFloat)));
  for (const auto& name : zero_->state_names()) {
    const at::Tensor t = zero_->state_partition(name);
    // DeepSpeed's (rigid) optimizer state covers the whole partition, padding included.
    at::Tensor full = at::zeros({ds.partition}, at::kFloat);
    full.slice(0, 0, held).copy_(zero::to_ds_partition(layout, ds, t, *group_));
    entry.set(PyValue(name), PyValue(full));
  }
  PyValue state = PyValue::dict();
  state.push_entry(PyValue(0), std::move(entry));
  PyValue base = PyValue::dict();
  base.set(PyValue("state"), std::move(state));
  // One flat partition holds every group (the groups' settings follow, each naming it).
  base.set(PyValue("param_groups"),
           param_groups(opt, std::vector<std::vector<int64_t>>(opt.num_shards(), {0})));

  PyValue paddings = PyValue::list();
  for (size_t i = 0; i < zero_->params().size(); ++i) paddings.append(PyValue(0));

  PyValue osd = PyValue::dict();
  osd.set(PyValue("dynamic_loss_scale"), PyValue(scaler_->dynamic()));
  osd.set(PyValue("overflow"), PyValue(false));
  osd.set(PyValue("clip_grad"), PyValue(config_.gradient_clipping));
  // Stage 3's keys differ: DeepSpeed's DeepSpeedZeroOptimizer_Stage3.state_dict().
  osd.set(PyValue(stage3 ? "optimizer_state_dict" : "base_optimizer_state"), std::move(base));
  osd.set(PyValue(stage3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups"),
          PyValue::list(
              {PyValue(zero::to_ds_partition(layout, ds, zero_->master_partition(), *group_))}));
  osd.set(PyValue("zero_stage"), PyValue(zero_->stage()));
  if (stage3) {
    osd.set(PyValue("partition_count"), PyValue(group_->size()));
  } else {
    osd.set(PyValue("group_paddings"), PyValue::list({PyValue(ds.partition - held)}));
    osd.set(PyValue("param_alignment_paddings"), PyValue::list({std::move(paddings)}));
    osd.set(PyValue("partition_count"), PyValue::list({PyValue(group_->size())}));
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
  if (!client_state.is_dict())
    throw std::invalid_argument("save_checkpoint: client_state must be a dict");
  for (const auto& k : client_state.keys()) {
    const auto& reserved = checkpoint::engine_state_keys();
    if (k.is_string() &&
        std::find(reserved.begin(), reserved.end(), k.as_string()) != reserved.end())
      throw std::invalid_argument("save_checkpoint: client_state key '" + k.as_string() +
                                  "' is one the engine writes itself");
  }
  check_tag_agrees(tag);
  at::NoGradGuard no_grad;
  // The collective parts first, on every rank, before any file is touched.
  PyValue rng = gather_rng_states();
  PyValue zero_file = zero_->stage() >= 1 ? zero_states() : PyValue();
  std::string error;
  try {
    checkpoint::make_tag_dir(save_dir, tag);
    if (zero_->stage() >= 1)
      checkpoint::save_torch_file(
          zero_file,
          checkpoint::zero_states_path(save_dir, tag, group_->rank(), dtype_ == at::kBFloat16));
    // Stage 3: every rank writes its own model-states file, as DeepSpeed does.
    if (zero_->stage() >= 3)
      checkpoint::save_torch_file(
          model_states(client_state, std::move(rng)),
          checkpoint::zero_model_states_path(save_dir, tag, group_->rank()));
    else if (group_->rank() == 0)
      checkpoint::save_torch_file(model_states(client_state, std::move(rng)),
                                  checkpoint::model_states_path(save_dir, tag));
  } catch (const std::exception& e) {
    error = fmt::format("save_checkpoint '{}' (rank {}): {}", checkpoint::tag_dir(save_dir, tag),
                        group_->rank(), e.what());
  }
  agree(error, "save_checkpoint");
  // Only now is the tag complete on every rank: a crash before this line leaves `latest`
  // naming the previous checkpoint.
  error.clear();
  if (group_->rank() == 0) {
    try {
      checkpoint::write_latest(save_dir, tag);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  agree(error, "save_checkpoint");
}

void EngineCore::load_module(const PyValue& model, const std::string& path) {
  const PyValue& module = need(model, "module", path);
  if (!module.is_dict()) throw CheckpointError("'" + path + "': 'module' is not a state dict");
  std::vector<std::string> missing, mismatched, unexpected_params;
  std::set<std::string> ours;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;
  auto visit = [&](const NamedParams& named) {
    for (const auto& [name, t] : named) {
      ours.insert(name);
      const PyValue* v = module.find(PyValue(name));
      if (!v || !v->is_tensor()) {
        missing.push_back(name);
        continue;
      }
      const at::Tensor& src = v->as_tensor();
      if (src.sizes() != t.sizes()) {
        mismatched.push_back(fmt::format("{} (checkpoint {}, model {})", name,
                                         fmt::join(src.sizes(), "x"), fmt::join(t.sizes(), "x")));
        continue;
      }
      copies.emplace_back(t, src);
    }
  };
  if (zero_->stage() < 3) {
    visit(named_params_());
  } else {
    // Parameters outside ZeRO (frozen ones) are in `module` as at the other stages.
    std::set<std::string> partitioned(param_names_.begin(), param_names_.end());
    for (const auto& [alias, name] : shared_params_) partitioned.insert(alias);
    NamedParams others;
    for (const auto& [name, p] : named_params_())
      if (!partitioned.count(name)) others.emplace_back(name, p);
    visit(others);
    // The parameters' values come from the ZeRO files; their names and shapes must match.
    const PyValue& shapes_v = need(model, "param_shapes", path);
    std::map<std::string, std::vector<int64_t>> saved;
    if (shapes_v.is_list())
      for (const auto& g : shapes_v.items())
        for (size_t i = 0; i < g.size(); ++i)
          saved[g.keys()[i].as_string()] = g.values()[i].as_ints();
    for (size_t i = 0; i < param_names_.size(); ++i) {
      auto it = saved.find(param_names_[i]);
      if (it == saved.end()) {
        missing.push_back(param_names_[i]);
      } else if (it->second != zero_->param_shape(i)) {
        mismatched.push_back(fmt::format("{} (checkpoint {}, model {})", param_names_[i],
                                         fmt::join(it->second, "x"),
                                         fmt::join(zero_->param_shape(i), "x")));
      }
      saved.erase(param_names_[i]);
    }
    for (const auto& [name, shape] : saved) unexpected_params.push_back(name);
  }
  visit(named_buffers_());
  std::vector<std::string> unexpected = unexpected_params;
  for (const auto& k : module.keys())
    if (!k.is_string() || !ours.count(k.as_string()))
      unexpected.push_back(k.is_string() ? k.as_string() : "<non-string key>");
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
    std::string msg = "'" + path + "' is a checkpoint of another model:";
    if (!missing.empty()) msg += " missing " + list_names(missing) + ";";
    if (!unexpected.empty()) msg += " unexpected " + list_names(unexpected) + ";";
    if (!mismatched.empty()) msg += " shapes differ for " + list_names(mismatched) + ";";
    msg.pop_back();
    throw CheckpointError(msg);
  }
  at::NoGradGuard no_grad;
  for (auto& [dst, src] : copies) dst.copy_(src);
}

void EngineCore::load_stage0_optimizer(const PyValue& model, const std::string& path,
                                       bool load_optimizer_states) {
  const PyValue& optimizer = need(model, "optimizer", path);
  if (optimizer.is_none())
    throw CheckpointError("'" + path + "' holds no optimizer state (a ZeRO stage 1-2 checkpoint?)");
  const auto& layout = zero_->layout();
  const auto& params = zero_->params();
  const PyValue* fp32 = optimizer.find(PyValue("dscpp_fp32_params"));
  if (fp32) {
    if (!fp32->is_list() || fp32->size() != params.size())
      throw CheckpointError("'" + path + "': dscpp_fp32_params does not match the parameters");
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& lp = layout.params[i];
      zero_->master_partition()
          .slice(0, lp.offset, lp.offset + lp.numel)
          .copy_(fp32->items()[i].as_tensor().reshape({-1}));
    }
  } else {
    zero_->refresh_master_from_params();
  }
  if (!load_optimizer_states) return;
  const std::string where = path + ": optimizer";
  const PyValue& state = need(optimizer, "state", where);
  int64_t step = 0;
  std::map<std::string, at::Tensor> parts;  // each state over the whole partition
  for (const auto& name : zero_->state_names()) parts[name] = zero_->state_partition(name);
  for (size_t i = 0; i < params.size(); ++i) {
    const PyValue* entry = state.find(PyValue(static_cast<int64_t>(i)));
    if (!entry) {
      // torch.optim has no state for a parameter that never stepped: it keeps the zeros.
      continue;
    }
    const auto& lp = layout.params[i];
    for (auto& [name, t] : parts) {
      const std::string entry_path = path + ": optimizer state " + std::to_string(i);
      const PyValue& src = need(*entry, name.c_str(), entry_path);
      if (src.as_tensor().numel() != lp.numel)
        throw CheckpointError(
            fmt::format("'{}': optimizer state {} of parameter {} has {} "
                        "elements, the parameter {}",
                        path, name, param_names_[i], src.as_tensor().numel(), lp.numel));
      t.slice(0, lp.offset, lp.offset + lp.numel).copy_(src.as_tensor().reshape({-1}));
    }
    if (const PyValue* s = entry->find(PyValue("step"))) step = step_of(*s);
  }
  for (const auto& [name, t] : parts) zero_->load_state_partition(name, t);
  zero_->set_step_count(step);
}

void EngineCore::load_zero_partitions(const std::string& dir, const std::string& tag,
                                      int saved_world, bool load_optimizer_states) {
  const auto& layout = zero_->layout();
  const int me = zero_->layout_rank();
  const auto numels = numels_of(*zero_);
  int64_t step = -1;
  std::map<std::string, at::Tensor> parts;  // each state over the whole partition
  for (const auto& name : zero_->state_names()) parts[name] = zero_->state_partition(name);
  for (int f = 0; f < saved_world; ++f) {
    const std::string path = checkpoint::find_zero_states(dir, tag, f);
    PyValue file = checkpoint::load_torch_file(path);
    const PyValue& osd = need(file, "optimizer_state_dict", path);
    const int64_t stage = need(osd, "zero_stage", path).as_int();
    if (stage != zero_->stage())
      throw CheckpointError(
          fmt::format("'{}' is a ZeRO stage {} checkpoint; this engine runs "
                      "stage {}",
                      path, stage, zero_->stage()));
    const bool stage3 = stage >= 3;
    const PyValue& count_v = need(osd, "partition_count", path);
    const int64_t count = count_v.is_int()      ? count_v.as_int()
                          : count_v.size() == 1 ? count_v.items()[0].as_int()
                                                : -1;
    if (count != saved_world)
      throw CheckpointError(fmt::format("'{}' was written by {} ranks, the model states say {}",
                                        path, count, saved_world));
    std::vector<int64_t> paddings;
    if (const PyValue* p = osd.find(PyValue("param_alignment_paddings")))
      if (p->is_list() && p->size() == 1) paddings = p->items()[0].as_ints();
    const auto ds = ds_layout(static_cast<int>(stage), numels, saved_world, paddings);
    const int64_t held = ds.held(f);

    const PyValue& groups =
        need(osd, stage3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups", path);
    if (!groups.is_list() || groups.size() != 1)
      throw CheckpointError("'" + path + "' holds " + std::to_string(groups.size()) +
                            " parameter groups; this engine has 1");
    const at::Tensor& fp32 = groups.items()[0].as_tensor();
    if (fp32.numel() != held)
      throw CheckpointError(fmt::format("'{}' holds {} fp32 elements; rank {} of {} should hold {}",
                                        path, fp32.numel(), f, saved_world, held));
    zero::from_ds_partition(layout, me, ds, f, fp32, zero_->master_partition());

    if (!load_optimizer_states) continue;
    const PyValue& base = need(osd, stage3 ? "optimizer_state_dict" : "base_optimizer_state", path);
    if (base.is_list())
      throw CheckpointError("'" + path +
                            "' is an elastic checkpoint (zero_optimization.elastic_checkpoint), "
                            "which dscpp does not read");
    const std::string base_path = path + ": base_optimizer_state";
    const PyValue& state = need(base, "state", base_path);
    const PyValue* entry = state.find(PyValue(0));
    if (!entry) continue;  // never stepped: zeros, as ours are
    for (auto& [name, t] : parts) {
      const at::Tensor& src = need(*entry, name.c_str(), base_path).as_tensor();
      if (src.numel() < held)
        throw CheckpointError(
            fmt::format("'{}': optimizer state {} holds {} elements, fewer "
                        "than the partition's {}",
                        path, name, src.numel(), held));
      zero::from_ds_partition(layout, me, ds, f, src.reshape({-1}).slice(0, 0, held), t);
    }
    if (const PyValue* s = entry->find(PyValue("step"))) {
      const int64_t st = step_of(*s);
      if (step >= 0 && st != step)
        throw CheckpointError(
            fmt::format("'{}': step {} differs from other partitions' {}", path, st, step));
      step = st;
    }
  }
  if (!load_optimizer_states) return;
  for (const auto& [name, t] : parts) zero_->load_state_partition(name, t);
  if (step >= 0) zero_->set_step_count(step);
}

LoadCheckpointResult EngineCore::load_checkpoint(const std::string& load_dir,
                                                 const std::string& tag_in,
                                                 const LoadCheckpointOptions& options) {
  namespace fs = std::filesystem;
  // Files may hold tensors that require grad (DeepSpeed saves its fp32 partitions as
  // parameters): copying them into our buffers must not build an autograd graph.
  at::NoGradGuard no_grad;
  LoadCheckpointResult result;
  std::string error;
  PyValue rng;
  try {
    std::string tag = tag_in;
    if (tag.empty()) {
      auto latest = checkpoint::read_latest(load_dir);
      if (!latest)
        throw CheckpointError("no checkpoint to load: '" + load_dir +
                              "' has no 'latest' file (pass a tag, or save one first)");
      tag = *latest;
    }
    checkpoint::check_tag(tag);
    if (!fs::is_directory(checkpoint::tag_dir(load_dir, tag)))
      throw CheckpointError("no checkpoint '" + tag + "' in '" + load_dir + "'");
    // Stages 0-2 keep one model-states file; stage 3 one per rank (rank 0's is read).
    std::string path = checkpoint::model_states_path(load_dir, tag);
    if (!fs::exists(path) && fs::exists(checkpoint::zero_model_states_path(load_dir, tag, 0)))
      path = checkpoint::zero_model_states_path(load_dir, tag, 0);
    PyValue model = checkpoint::load_torch_file(path);
    result.path = checkpoint::tag_dir(load_dir, tag);

    // Which stage wrote it: ours say so; DeepSpeed's keep the optimizer here only at stage 0.
    int saved_stage = 0;
    if (const PyValue* s = model.find(PyValue("dscpp_zero_stage"))) {
      saved_stage = static_cast<int>(s->as_int());
    } else if (need(model, "optimizer", path).is_none()) {
      saved_stage = -1;  // 1 or 2: the ZeRO files tell
    }
    if (!options.load_module_only && saved_stage >= 0 && saved_stage != zero_->stage() &&
        (saved_stage == 0 || zero_->stage() == 0))
      throw CheckpointError(
          fmt::format("'{}' is a ZeRO stage {} checkpoint; this engine runs stage {}", path,
                      saved_stage, zero_->stage()));
    if (!options.load_module_only && saved_stage == -1 && zero_->stage() == 0)
      throw CheckpointError("'" + path +
                            "' is a ZeRO stage 1-2 checkpoint; this engine runs stage 0");

    load_module(model, path);
    if (options.load_module_only) {
      zero_->refresh_master_from_params();
    } else {
      if (zero_->stage() == 0) {
        load_stage0_optimizer(model, path, options.load_optimizer_states);
      } else {
        const int saved_world = static_cast<int>(need(model, "dp_world_size", path).as_int());
        if (saved_world < 1) throw CheckpointError("'" + path + "': dp_world_size < 1");
        load_zero_partitions(load_dir, tag, saved_world, options.load_optimizer_states);
      }
      const PyValue& sched = need(model, "lr_scheduler", path);
      if (options.load_lr_scheduler_states && scheduler_ && !sched.is_none())
        scheduler_->load_state_dict(sched.to_json());
      global_steps_ = need(model, "global_steps", path).as_int();
      const PyValue* samples = model.find(PyValue("global_samples"));
      global_samples_ = samples ? samples->as_int() : global_steps_ * config_.train_batch_size;
      skipped_steps_ = need(model, "skipped_steps", path).as_int();
      const PyValue* micro = model.find(PyValue("dscpp_micro_steps"));
      micro_steps_ = micro ? micro->as_int() : global_steps_ * config_.gradient_accumulation_steps;
      if (const PyValue* ls = model.find(PyValue("dscpp_loss_scaler"))) {
        scaler_->load_state_dict(ls->to_json());
      } else if (zero_->stage() >= 1) {
        // DeepSpeed pickles its LossScaler object; we read it as a dict of its fields.
        PyValue z = checkpoint::load_torch_file(checkpoint::find_zero_states(load_dir, tag, 0));
        const PyValue* ls0 = need(z, "optimizer_state_dict", load_dir).find(PyValue("loss_scaler"));
        if (ls0 && ls0->is_dict()) {
          nlohmann::json j = ls0->to_json();
          j.erase("__class__");
          scaler_->load_state_dict(j);
        }
      }
      if (const PyValue* r = model.find(PyValue("dscpp_rng_states"))) rng = *r;
    }
    for (size_t i = 0; i < model.size(); ++i) {
      const PyValue& k = model.keys()[i];
      const auto& reserved = checkpoint::engine_state_keys();
      if (k.is_string() &&
          std::find(reserved.begin(), reserved.end(), k.as_string()) != reserved.end())
        continue;
      result.client_state.set(k, model.values()[i]);
    }
  } catch (const std::exception& e) {
    error = fmt::format("load_checkpoint (rank {}): {}", group_->rank(), e.what());
  }
  agree(error, "load_checkpoint");
  zero_->publish_master();
  if (!rng.is_none()) restore_rng_state(rng);
  return result;
}

}  // namespace dscpp
