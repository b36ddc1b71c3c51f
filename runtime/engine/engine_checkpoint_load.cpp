// EngineCore::load_checkpoint: the files engine_checkpoint_save.cpp describes, read back into
// the engine. A checkpoint laid out as this engine's own partitions is read as it lies
// (engine_checkpoint_own.cpp); every other layout through its normal form (universal_load.h):
// every parameter whole by name, each member of the ZeRO set cutting its own part. Then the
// counters, the scaler, the random-number states and the client state. Every problem is a
// CheckpointError naming the file, raised on every rank.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "dscpp/nn/rng_tracker.h"
#include "dscpp/optim/lr_schedules.h"
#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/tp_reshape.h"
#include "dscpp/runtime/checkpoint/universal.h"
#include "dscpp/runtime/checkpoint/universal_from_zero.h"
#include "dscpp/runtime/engine/checkpoint_parts.h"
#include "dscpp/runtime/engine/engine_core.h"
#include "dscpp/runtime/engine/universal_load.h"
#include "dscpp/runtime/precision/loss_scaler.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp {

using checkpoint::CheckpointError;
using checkpoint::PyValue;
using namespace engine_checkpoint;

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
  restore_rng_tracker(mine.find(PyValue("rng_tracker_states")));
}

void EngineCore::restore_rng_tracker(const PyValue* saved) {
  nn::RNGStatesTracker& tracker = nn::get_cuda_rng_tracker();
  const auto current = tracker.get_states();
  if (!saved || !saved->is_dict()) {
    // Saved before the tracker was (or by a program without one): its streams go on from
    // where this run seeded them.
    if (!current.empty() && group_->rank() == 0)
      std::cerr << "dscpp: the checkpoint holds no model-parallel RNG tracker states; the "
                   "tracker keeps this run's seeds\n";
    return;
  }
  // A state is a generator's for the tracker's device: one of another device type (a CPU
  // run's on a GPU) has another size, and is not restored.
  const int64_t expected =
      at::globalContext().defaultGenerator(tracker.device()).get_state().numel();
  std::map<std::string, at::Tensor> states;
  for (size_t i = 0; i < saved->size(); ++i) {
    const PyValue& v = saved->values()[i];
    if (!saved->keys()[i].is_string() || !v.is_tensor() || v.as_tensor().numel() != expected) {
      if (group_->rank() == 0)
        std::cerr << "dscpp: the checkpoint's model-parallel RNG tracker states are not this "
                     "device's generator states; they are not restored\n";
      return;
    }
    states.emplace(saved->keys()[i].as_string(), v.as_tensor());
  }
  tracker.set_states(states);
}

void EngineCore::load_engine_counters(const PyValue& model, const std::string& path,
                                      const LoadCheckpointOptions& options) {
  const PyValue& sched = need(model, "lr_scheduler", path);
  if (options.load_lr_scheduler_states && scheduler_ && !sched.is_none())
    scheduler_->load_state_dict(sched.to_json());
  global_steps_ = need(model, "global_steps", path).as_int();
  const PyValue* samples = model.find(PyValue("global_samples"));
  global_samples_ = samples ? samples->as_int() : global_steps_ * config_.train_batch_size;
  skipped_steps_ = need(model, "skipped_steps", path).as_int();
  const PyValue* micro = model.find(PyValue("dscpp_micro_steps"));
  micro_steps_ = micro ? micro->as_int() : global_steps_ * config_.gradient_accumulation_steps;
  if (const PyValue* ls = model.find(PyValue("dscpp_loss_scaler")))
    scaler_->load_state_dict(ls->to_json());
}

bool EngineCore::latest_tag(const std::string& load_dir, std::string* tag) {
  std::string error;
  bool found = false;
  // checkpoint.load_universal: the tag latest_universal names, and none is an error (as
  // DeepSpeed's "Invalid for universal checkpoint").
  const bool universal = config_.checkpoint.load_universal;
  try {
    if (auto latest = checkpoint::read_latest(
            load_dir, universal ? checkpoint::kLatestUniversal : "latest")) {
      *tag = *latest;
      found = true;
    } else if (universal) {
      throw CheckpointError(
          "checkpoint.load_universal is set, but '" +
          (std::filesystem::path(load_dir) / checkpoint::kLatestUniversal).string() +
          "' does not exist (tools/to_universal or DeepSpeed's ds_to_universal writes it)");
    } else if (ckpt_group().rank() == 0) {
      // DeepSpeed's engine warns so, and returns (None, None): nothing is loaded.
      std::cerr << "dscpp: warning: Unable to find latest file at "
                << (std::filesystem::path(load_dir) / "latest").string()
                << ", if trying to load latest checkpoint please ensure this file exists or "
                   "pass an explicit checkpoint tag when loading a checkpoint.\n";
    }
  } catch (const std::exception& e) {
    error = fmt::format("load_checkpoint (rank {}): {}", group_->rank(), e.what());
  }
  agree(error, "load_checkpoint");
  comm::ProcessGroup& g = ckpt_group();
  if (g.size() > 1) {
    // Every rank loads, or none does: a `latest` that some ranks see and others not is wrong.
    at::Tensor n =
        at::full({1}, found ? 1.0f : 0.0f, at::TensorOptions().dtype(at::kFloat).device(device_));
    g.all_reduce(n).wait();
    const float seen = n.item<float>();
    if (seen > 0 && seen < static_cast<float>(g.size()))
      throw CheckpointError(fmt::format(
          "load_checkpoint: '{}' has a 'latest' file that {} of {} ranks see (rank {} {})",
          load_dir, seen, g.size(), g.rank(), found ? "does" : "does not"));
  }
  return found;
}

void EngineCore::load_normal_form(const WholeParams& whole, const PyValue& module,
                                  const std::string& where, const LoadCheckpointOptions& options) {
  const bool states = options.load_optimizer_states && !options.load_module_only;
  for (const auto& p : zero_set_) p.load_by_name(whole, states);
  // A frozen parameter split over the tensor ranks: this rank's shard of it.
  const int t = tensor_parallel_size(), me = tensor_parallel_rank();
  std::map<std::string, checkpoint::ParamPartition> parts;
  if (t > 1) parts = partitions_of(tensor_parallel_info());
  // What ZeRO does not hold, from the module: a frozen parameter must be there (unless
  // load_module_strict is false) at its shape; a buffer is taken where it is.
  std::set<std::string> partitioned;
  for (const auto& p : zero_set_) partitioned.insert(p.names->begin(), p.names->end());
  for (const auto& [alias, name] : shared_params_) partitioned.insert(alias);
  auto take = [&](const std::string& name, at::Tensor dst, bool frozen_param) {
    const PyValue* v = module.is_dict() ? module.find(PyValue(name)) : nullptr;
    if (!v || !v->is_tensor()) {
      if (frozen_param && options.load_module_strict)
        throw CheckpointError(
            fmt::format("{}: no frozen parameter '{}' in its module (load_module_strict=false "
                        "keeps this model's)",
                        where, name));
      return;
    }
    at::Tensor src = v->as_tensor();
    if (auto it = parts.find(name); it != parts.end() && it->second.partition_dim)
      src = checkpoint::tp_shard(src, it->second, me, where + ": " + name);
    if (src.sizes() != dst.sizes()) {
      if (!frozen_param) return;
      throw CheckpointError(fmt::format("{}: '{}' is {} there, {} in this model", where, name,
                                        fmt::join(src.sizes(), "x"), fmt::join(dst.sizes(), "x")));
    }
    dst.copy_(src);
  };
  for (const auto& [name, p] : named_params_())
    if (!partitioned.count(name)) take(name, p, true);
  for (const auto& [name, b] : named_buffers_()) take(name, b, false);
}

PyValue EngineCore::rng_states_of(const std::string& dir, const std::string& tag,
                                  const PyValue& model, const std::string& path) {
  int64_t stages = 1, t = 1, d = 0;
  if (const PyValue* p = model.find(PyValue("dscpp_pipe"))) {
    stages = need(*p, "stages", path).as_int();
    d = need(*p, "data_parallel_size", path).as_int();
    if (const PyValue* m = p->find(PyValue("model_parallel_size"))) t = m->as_int();
  } else if (const PyValue* info = model.find(PyValue("dscpp_tensor_parallel"))) {
    t = need(*info, "tp_degree", path).as_int();
    d = need(*info, "data_parallel_size", path).as_int();
  } else if (const PyValue* w = model.find(PyValue("dp_world_size"))) {
    d = w->as_int();
  }
  if (stages == ckpt_layout_.stages && t == tensor_parallel_size() && d == group_->size()) {
    // This rank's model-states file holds the states of its data ranks.
    const std::string mine =
        ckpt_layout_.model_states_path ? ckpt_layout_.model_states_path(dir, tag) : path;
    const PyValue other = mine == path ? PyValue() : checkpoint::load_torch_file(mine);
    const PyValue* r = (mine == path ? model : other).find(PyValue("dscpp_rng_states"));
    return r ? *r : PyValue();
  }
  if (ckpt_group().rank() == 0)
    std::cerr << fmt::format(
        "dscpp: the checkpoint was saved on {} stages x {} data ranks x {} model ranks, this run "
        "has {} x {} x {}: its random-number states are not restored\n",
        stages, d, t, ckpt_layout_.stages, group_->size(), tensor_parallel_size());
  return PyValue();
}

void EngineCore::lay_out_as_saved(const std::string& dir, const std::string& tag,
                                  const PyValue& model, const std::string& path) {
  bool pending = false;
  for (const auto& p : zero_set_) pending |= !p.zero->is_built();
  if (!pending) return;
  // This rank's model-states file (a pipeline stage's, a model rank's) holds its partitions'.
  const std::string mine =
      ckpt_layout_.model_states_path ? ckpt_layout_.model_states_path(dir, tag) : path;
  if (mine != path && !std::filesystem::exists(mine)) return;  // (another layout's files)
  const PyValue other = mine == path ? PyValue() : checkpoint::load_torch_file(mine);
  const PyValue* orders = (mine == path ? model : other).find(PyValue("dscpp_layout_orders"));
  for (auto& p : zero_set_) {
    if (p.zero->is_built()) continue;
    const PyValue* order = orders && orders->is_dict() ? orders->find(PyValue(p.name)) : nullptr;
    if (!order || !order->is_list()) continue;  // (then the guess: DeepSpeed's files, say)
    std::vector<int> ints;
    for (int64_t i : order->as_ints()) ints.push_back(static_cast<int>(i));
    // Another model's order (other parameters) is not this one's: the guess then.
    if (ints.size() != p.zero->params().size()) continue;
    p.zero->build_in_order(ints);
  }
}

LoadCheckpointResult EngineCore::load_checkpoint(const std::string& load_dir,
                                                 const std::string& tag_in,
                                                 const LoadCheckpointOptions& options) {
  namespace fs = std::filesystem;
  // Files may hold tensors that require grad (DeepSpeed saves its fp32 partitions as
  // parameters): copying them into our buffers must not build an autograd graph.
  at::NoGradGuard no_grad;
  zero_->wait_all_published();  // nothing may still be writing the parameters it replaces
  LoadCheckpointResult result;
  std::string error;
  PyValue rng;
  std::string tag = tag_in;
  if (tag.empty() && !latest_tag(load_dir, &tag)) return result;  // nothing to load
  try {
    checkpoint::check_tag(tag);
    if (!fs::is_directory(checkpoint::tag_dir(load_dir, tag)))
      throw CheckpointError("no checkpoint '" + tag + "' in '" + load_dir + "'");
    // Stages 0-2 keep one model-states file; stage 3 one per rank (rank 0's is read).
    std::string path = checkpoint::model_states_path(load_dir, tag);
    if (!fs::exists(path) && fs::exists(checkpoint::zero_model_states_path(load_dir, tag, 0)))
      path = checkpoint::zero_model_states_path(load_dir, tag, 0);
    const PyValue model = checkpoint::load_torch_file(path);
    lay_out_as_saved(load_dir, tag, model, path);
    result.path = checkpoint::tag_dir(load_dir, tag);
    // A universal checkpoint holds whole tensors (zero/<name>/): any stage, any ranks.
    const bool universal = config_.checkpoint.load_universal;
    PyValue settings;  // the optimizer's settings: DeepSpeed's loss scaler is there
    if (!universal && is_own_layout(load_dir, tag, model, path, options)) {
      load_own_layout(load_dir, tag, model, path, options, result, settings);
      if (const PyValue* r = model.find(PyValue("dscpp_rng_states"))) rng = *r;
    } else if (universal) {
      // As DeepSpeed's universal load: the weights from zero/<name>/, the buffers from the
      // model states' module.
      settings = checkpoint::load_torch_file(
          (fs::path(result.path) / "zero" / "optimizer_state.pt").string());
      const PyValue* module = model.find(PyValue("module"));
      load_normal_form(WholeParams::universal_folder(result.path),
                       module ? *module : PyValue::dict(), result.path, options);
      if (const PyValue* r = model.find(PyValue("dscpp_rng_states"))) rng = *r;
    } else {
      // Any other layout (another ZeRO stage, expert-parallel degree, tensor degree, number of
      // pipeline stages, or the plain engine and a pipeline's): the normal form, every rank's
      // files consolidated into the one-rank model's parameters (universal_from_zero.h).
      // (Experts with tensor parallelism train at ZeRO stages 0-2 only.)
      if (client_.expert_params && !client_.expert_params->empty() && tensor_parallel_size() > 1 &&
          zero_->stage() >= 3)
        throw CheckpointError(fmt::format(
            "'{}': experts with tensor parallelism train, and a MoE checkpoint loads, at ZeRO "
            "stages 0-2; this engine runs stage {}",
            path, zero_->stage()));
      checkpoint::UniversalCheckpoint ck =
          checkpoint::universal_from_zero_checkpoint(load_dir, tag);
      settings = std::move(ck.optimizer_state);
      load_normal_form(WholeParams::consolidated(std::move(ck.params), result.path),
                       need(ck.model, "module", path), result.path, options);
      rng = rng_states_of(load_dir, tag, model, path);
    }
    if (!options.load_module_only) {
      load_engine_counters(model, path, options);
      // Ours keep the scaler with the counters; DeepSpeed pickles its LossScaler object, which
      // we read as a dict of its fields.
      const PyValue* ls = settings.is_dict() ? settings.find(PyValue("loss_scaler")) : nullptr;
      if (!model.contains(PyValue("dscpp_loss_scaler")) && ls && ls->is_dict()) {
        nlohmann::json j = ls->to_json();
        j.erase("__class__");
        scaler_->load_state_dict(j);
      }
    } else {
      rng = PyValue();
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
  publish_masters();
  if (!rng.is_none()) restore_rng_state(rng);
  return result;
}

}  // namespace dscpp