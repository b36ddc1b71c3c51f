// DeepSpeed's universal checkpoint files: see universal.h.
#include "dscpp/runtime/checkpoint/universal.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "dscpp/runtime/checkpoint/ds_layout.h"

namespace dscpp::checkpoint {

namespace fs = std::filesystem;

namespace {

PyValue ints(const std::vector<int64_t>& v) {
  PyValue l = PyValue::list();
  for (int64_t x : v) l.append(PyValue(x));
  return l;
}

std::vector<int64_t> ints_or_empty(const PyValue* v) {
  return v && !v->is_none() ? v->as_ints() : std::vector<int64_t>{};
}

// DeepSpeed's per-state file: {"param": tensor, "cat_dim": 0, ...}, or (its stage-3 merge)
// the bare tensor.
PyValue state_file(const at::Tensor& t, const ParamPartition& part) {
  PyValue d = PyValue::dict();
  d.set("param", PyValue(t.detach().contiguous().to(at::kFloat).cpu()));
  d.set("cat_dim", PyValue(part.partition_dim.value_or(0)));
  // A fused tensor of equal sub-parts (QKV): DeepSpeed's loader cuts each on its own.
  const auto& sub = part.sub_param_sizes;
  if (sub.size() > 1 && std::all_of(sub.begin(), sub.end(), [&](int64_t n) { return n == sub[0]; }))
    d.set("param_n_sub_params", PyValue(static_cast<int64_t>(part.sub_param_sizes.size())));
  d.set("dscpp_partition", part.to_py());
  return d;
}

}  // namespace

ParamPartition ParamPartition::whole(std::vector<int64_t> shape) {
  ParamPartition p;
  p.logical_shape = std::move(shape);
  return p;
}

PyValue ParamPartition::to_py() const {
  PyValue d = PyValue::dict();
  d.set("logical_shape", ints(logical_shape));
  d.set("tp_degree", PyValue(tp_degree));
  d.set("partition_dim", partition_dim ? PyValue(*partition_dim) : PyValue());
  d.set("partition_sizes", partition_sizes.empty() ? PyValue() : ints(partition_sizes));
  d.set("sub_param_sizes", sub_param_sizes.empty() ? PyValue() : ints(sub_param_sizes));
  d.set("replicated", PyValue(!partition_dim.has_value()));
  return d;
}

ParamPartition ParamPartition::from_py(const PyValue& v, const std::string& where) {
  if (!v.is_dict()) throw CheckpointError(where + ": dscpp_partition is not a dict");
  try {
    ParamPartition p;
    p.logical_shape = v.at(PyValue("logical_shape")).as_ints();
    if (const PyValue* t = v.find(PyValue("tp_degree"))) p.tp_degree = t->as_int();
    if (const PyValue* d = v.find(PyValue("partition_dim")); d && !d->is_none())
      p.partition_dim = d->as_int();
    p.partition_sizes = ints_or_empty(v.find(PyValue("partition_sizes")));
    p.sub_param_sizes = ints_or_empty(v.find(PyValue("sub_param_sizes")));
    if (p.tp_degree < 1) throw CheckpointError("tp_degree < 1");
    if (p.partition_dim &&
        (*p.partition_dim < 0 || *p.partition_dim >= static_cast<int64_t>(p.logical_shape.size())))
      throw CheckpointError(fmt::format("partition_dim {} outside a tensor of {} dimensions",
                                        *p.partition_dim, p.logical_shape.size()));
    if (!p.partition_sizes.empty() && static_cast<int64_t>(p.partition_sizes.size()) != p.tp_degree)
      throw CheckpointError(fmt::format("{} partition_sizes for tp_degree {}",
                                        p.partition_sizes.size(), p.tp_degree));
    return p;
  } catch (const std::exception& e) {
    throw CheckpointError(where + ": malformed dscpp_partition: " + e.what());
  }
}

std::string universal_param_dir(const std::string& tag_dir, const std::string& name) {
  return (fs::path(tag_dir) / "zero" / name).string();
}

void write_universal(const UniversalCheckpoint& ck, const std::string& dir,
                     const std::string& tag) {
  check_tag(tag);
  make_tag_dir(dir, tag);
  const std::string out = tag_dir(dir, tag);
  save_torch_file(ck.model, model_states_path(dir, tag));
  fs::create_directories(fs::path(out) / "zero");
  save_torch_file(ck.optimizer_state, (fs::path(out) / "zero" / "optimizer_state.pt").string());
  for (const UniversalParam& p : ck.params) {
    if (p.name.empty() || p.name.find('/') != std::string::npos || p.name == "." || p.name == "..")
      throw CheckpointError("parameter name '" + p.name + "' is not a folder name");
    const std::string pdir = universal_param_dir(out, p.name);
    fs::create_directories(pdir);
    save_torch_file(state_file(p.fp32, p.partition), pdir + "/fp32.pt");
    for (const auto& [state, t] : p.states) {
      if (state == "fp32" || state == "step")
        throw CheckpointError("optimizer state '" + state + "' clashes with a universal file");
      save_torch_file(state_file(t, p.partition), pdir + "/" + state + ".pt");
    }
    if (!p.step.is_none()) save_torch_file(p.step, pdir + "/step.pt");
  }
  // As ds_to_universal: the pointer moves once every file is in place.
  write_latest(dir, tag, kLatestUniversal);
}

UniversalParam read_universal_param(const std::string& tag_dir, const std::string& name,
                                    const std::vector<int64_t>& shape) {
  const std::string pdir = universal_param_dir(tag_dir, name);
  if (!fs::is_directory(pdir))
    throw CheckpointError("universal checkpoint '" + tag_dir + "' has no folder for parameter '" +
                          name + "' (expected " + pdir + ")");
  if (!fs::is_regular_file(pdir + "/fp32.pt"))
    throw CheckpointError("universal checkpoint: '" + pdir + "' has no fp32.pt");
  UniversalParam p;
  p.name = name;
  p.partition = ParamPartition::whole(shape);
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(pdir))
    if (e.is_regular_file() && e.path().extension() == ".pt") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  for (const std::string& path : files) {
    const std::string key = fs::path(path).stem().string();
    PyValue v = load_torch_file(path);
    if (key == "step") {
      p.step = std::move(v);
      continue;
    }
    const PyValue* t = &v;
    if (v.is_dict()) {
      t = v.find(PyValue("param"));
      if (!t) throw CheckpointError("'" + path + "' has no 'param' entry");
      if (const PyValue* m = v.find(PyValue("dscpp_partition")))
        p.partition = ParamPartition::from_py(*m, path);
    }
    if (!t->is_tensor()) throw CheckpointError("'" + path + "' holds no tensor under 'param'");
    at::Tensor tensor = t->as_tensor().to(at::kFloat);
    if (p.partition.logical_shape != shape || tensor.sizes().vec() != shape)
      throw CheckpointError(
          fmt::format("'{}' holds a tensor of shape {} (logical {}); the model's "
                      "'{}' is {}",
                      path, fmt::join(tensor.sizes(), "x"),
                      fmt::join(p.partition.logical_shape, "x"), name, fmt::join(shape, "x")));
    if (key == "fp32")
      p.fp32 = tensor;
    else
      p.states[key] = tensor;
  }
  return p;
}

}  // namespace dscpp::checkpoint
