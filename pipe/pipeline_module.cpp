// PipelineModule: see pipeline_module.h.
#include "dscpp/pipe/pipeline_module.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "dscpp/comm/rendezvous.h"
#include "dscpp/error.h"
#include "dscpp/nn/activation_checkpointing.h"
#include "dscpp/nn/layer_module.h"
#include "dscpp/pipe/partition.h"

namespace dscpp::pipe {

namespace {

void register_at(torch::nn::Module& root, const std::string& name,
                 const std::shared_ptr<torch::nn::Module>& module) {
  const size_t dot = name.rfind('.');
  torch::nn::Module& parent =
      dot == std::string::npos ? root : nn::module_at(root, name.substr(0, dot));
  parent.register_module(dot == std::string::npos ? name : name.substr(dot + 1), module);
}

}  // namespace

PipelineModule::PipelineModule(std::vector<nn::LayerSpec> specs, PipelineOptions options)
    : specs_(std::move(specs)), options_(std::move(options)) {
  if (specs_.empty()) throw Error("PipelineModule: no layers");
  for (const auto& s : specs_)
    if (s.name.empty()) throw Error("PipelineModule: a layer spec without a name");
  if (options_.num_chunks() < 1)
    throw Error(
        fmt::format("PipelineModule: num_chunks must be >= 1, found {}", options_.num_chunks()));
  if (options_.v_shape() && options_.num_chunks() != 2)
    throw Error(fmt::format(
        "PipelineModule: v_shape places two chunks per stage in a V, found num_chunks = {}",
        options_.num_chunks()));
  if (options_.activation_checkpoint_interval() < 0)
    throw Error(fmt::format("PipelineModule: activation_checkpoint_interval must be >= 0, found {}",
                            options_.activation_checkpoint_interval()));
  world_ = options_.group() ? options_.group() : comm::init_distributed();
  const int world = world_->size();
  if (options_.groups()) {
    groups_ = options_.groups();
    if (groups_->world != world_)
      throw Error("PipelineModule: PipelineOptions::groups were made on another world group");
    if (groups_->num_chunks != options_.num_chunks() && groups_->stages > 2)
      throw Error(
          fmt::format("PipelineModule: the groups were made for {} chunks, the module "
                      "has {} (make_parallel_groups' num_chunks)",
                      groups_->num_chunks, options_.num_chunks()));
  } else {
    std::optional<comm::Topology> topo = options_.topology();
    if (!topo) {
      if (options_.num_stages() < 1)
        throw Error("PipelineModule: give num_stages (PipelineOptions(n)) or a topology");
      if (world % options_.num_stages() != 0)
        throw Error(fmt::format(
            "PipelineModule: {} ranks do not split into {} stages (world size must be a "
            "multiple of num_stages)",
            world, options_.num_stages()));
      topo =
          comm::Topology({"pipe", "data"}, {options_.num_stages(), world / options_.num_stages()});
    }
    groups_ = make_parallel_groups(world_, *topo, options_.num_chunks());
  }
  stages_ = groups_->stages;
  data_size_ = groups_->data_size;
  if (options_.num_stages() && options_.num_stages() != stages_)
    throw Error(fmt::format("PipelineModule: num_stages {} but the topology's pipe axis is {}",
                            options_.num_stages(), stages_));
  stage_ = groups_->stage;
  data_id_ = groups_->data_id;
  data_group_ = groups_->data;
  pipe_group_ = groups_->pipe;
  const int parts = stages_ * options_.num_chunks();
  if (static_cast<int>(specs_.size()) < parts)
    throw Error(fmt::format(
        "PipelineModule: {} layers cannot fill {} stages x {} chunks = {} parts (each needs "
        "at least one layer)",
        specs_.size(), stages_, options_.num_chunks(), parts));
  partition();
  make_tied_groups();
  build_chunks();
}

void PipelineModule::partition() {
  // What DeepSpeed's _partition_layers looks at: each layer's type name and trainable count.
  // Only "parameters" and "type:" need them, and DeepSpeed builds every layer once for them.
  std::string method = options_.partition_method();
  std::transform(method.begin(), method.end(), method.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  std::vector<LayerInfo> infos(specs_.size());
  if (method != "uniform") {
    for (size_t i = 0; i < specs_.size(); ++i) {
      auto module = specs_[i].build();
      // name() is the demangled class ("dscpp::model_zoo::GPTBlockImpl"); DeepSpeed's
      // typename.__name__ is the bare class: "GPTBlock".
      std::string type = module->name();
      if (auto colon = type.rfind("::"); colon != std::string::npos) type = type.substr(colon + 2);
      if (type.size() > 4 && type.compare(type.size() - 4, 4, "Impl") == 0)
        type.resize(type.size() - 4);
      infos[i].type_name = type;
      for (const auto& p : module->parameters(/*recurse=*/true))
        if (p.requires_grad()) infos[i].trainable_params += p.numel();
    }
  }
  parts_ = partition_layers(options_.partition_method(), infos, stages_ * options_.num_chunks());
  for (size_t k = 0; k + 1 < parts_.size(); ++k)
    if (parts_[k] >= parts_[k + 1])
      throw Error(fmt::format("PipelineModule: partition '{}' leaves part {} without layers",
                              options_.partition_method(), k));
}

std::shared_ptr<comm::ProcessGroup> PipelineModule::link(int peer) const {
  auto it = groups_->links.find(peer);
  return it == groups_->links.end() ? nullptr : it->second;
}

// The schedules' placement arithmetic (pipe/schedule.h), for this module's layout.
PipeShape PipelineModule::placement() const {
  PipeShape shape;
  shape.stages = stages_;
  shape.stage = stage_;
  shape.chunks = options_.num_chunks();
  shape.kind = options_.v_shape() ? ScheduleKind::kZeroBubbleV : ScheduleKind::kAuto;
  return shape;
}

int PipelineModule::virtual_stage(int chunk) const {
  return pipe::virtual_stage(placement(), stage_, chunk);
}

int PipelineModule::stage_of_part(int k) const {
  return place_of(placement(), k).stage;
}

void PipelineModule::make_tied_groups() {
  const int d = data_size_, t = groups_->model_size;
  auto rank_of = [this](int stage, int data, int model) {
    return groups_->rank_of(stage, data, model);
  };
  // Tied keys on several stages, in the order of their first spec.
  std::vector<std::string> keys;
  std::map<std::string, std::set<int>> holders;
  std::map<std::string, int> first_spec;
  for (int k = 0; k + 1 < static_cast<int>(parts_.size()); ++k)
    for (int i = parts_[k]; i < parts_[k + 1]; ++i) {
      const auto& key = specs_[i].tied_key;
      if (key.empty()) continue;
      if (!first_spec.count(key)) {
        first_spec[key] = i;
        keys.push_back(key);
      }
      holders[key].insert(stage_of_part(k));
    }
  for (const auto& key : keys) {
    std::vector<int> stages(holders[key].begin(), holders[key].end());
    if (stages.size() < 2) continue;
    Tied tied;
    tied.key = key;
    tied.stages = stages;
    tied.module_name = specs_[first_spec[key]].name;
    for (const auto& s : specs_)
      if (s.tied_key == key)
        for (const auto& w : s.tied_weights)
          if (std::find(tied.params.begin(), tied.params.end(), w) == tied.params.end())
            tied.params.push_back(w);
    const bool mine = holders[key].count(stage_) > 0;
    // Per model rank: each holds its own shard of a tied tensor-parallel weight.
    for (int i = 0; i < d; ++i)
      for (int mm = 0; mm < t; ++mm) {
        std::vector<int> ranks;
        for (int s : stages) ranks.push_back(rank_of(s, i, mm));
        std::sort(ranks.begin(), ranks.end());
        auto g =
            world_->new_subgroup(ranks, fmt::format("tied '{}' (data {}, model {})", key, i, mm));
        if (g) tied.same_data = g;
      }
    for (int mm = 0; mm < t; ++mm) {
      std::vector<int> ranks;
      for (int s : stages)
        for (int i = 0; i < d; ++i) ranks.push_back(rank_of(s, i, mm));
      std::sort(ranks.begin(), ranks.end());
      auto g = world_->new_subgroup(ranks, fmt::format("tied '{}' (model {})", key, mm));
      if (g) tied.all_data = g;
    }
    if (mine) tied_.push_back(std::move(tied));
  }
}

void PipelineModule::build_chunks() {
  module_ = std::make_shared<torch::nn::Module>();
  std::map<std::string, std::shared_ptr<torch::nn::Module>> tied_modules;
  std::map<std::string, std::string> tied_name;  // key -> the whole model's first spec name
  for (const auto& s : specs_)
    if (!s.tied_key.empty() && !tied_name.count(s.tied_key)) tied_name[s.tied_key] = s.name;
  std::set<const torch::nn::Module*> registered;
  for (int c = 0; c < options_.num_chunks(); ++c) {
    StageChunk chunk;
    const int k = virtual_stage(c);
    chunk.begin = parts_[k];
    chunk.end = parts_[k + 1];
    for (int i = chunk.begin; i < chunk.end; ++i) {
      const auto& spec = specs_[i];
      std::shared_ptr<torch::nn::Module> module;
      if (!spec.tied_key.empty() && tied_modules.count(spec.tied_key)) {
        module = tied_modules[spec.tied_key];
      } else {
        if (options_.seed_layers()) at::manual_seed(options_.base_seed() + i);
        module = spec.build();
        if (!module) throw Error(fmt::format("PipelineModule: layer '{}' built null", spec.name));
        if (!spec.tied_key.empty()) tied_modules[spec.tied_key] = module;
      }
      if (registered.insert(module.get()).second)
        register_at(*module_, spec.tied_key.empty() ? spec.name : tied_name[spec.tied_key], module);
      nn::Layer layer{spec.name, module, {}, {}};
      nn::bind_forward(spec, module, layer);
      chunk.layers.push_back(std::move(layer));
    }
    chunks_.push_back(std::move(chunk));
  }
  // The copies of a tied module start equal: the first holder's (its data rank 0) values.
  // On the stages after the first, the parameters outside tied_weights are unused copies
  // (the GPT head's position embedding): frozen, so no optimizer state is kept for them.
  at::NoGradGuard no_grad;
  for (auto& t : tied_) {
    auto module = tied_modules.at(t.key);
    std::vector<at::Tensor> shared;
    for (const auto& item : module->named_parameters(/*recurse=*/true)) {
      const bool is_tied = t.params.empty() || std::find(t.params.begin(), t.params.end(),
                                                         item.key()) != t.params.end();
      if (is_tied) {
        shared.push_back(item.value());
      } else if (stage_ != t.stages.front()) {
        item.value().set_requires_grad(false);
      }
    }
    for (auto& w : shared) t.all_data->broadcast(w, 0).wait();
  }
}

Activation PipelineModule::forward_chunk(int c, const Activation& x) const {
  const auto& layers = chunks_.at(c).layers;
  const int interval = options_.activation_checkpoint_interval();
  if (interval == 0 || !at::GradMode::is_enabled()) return nn::run_layers(layers, x);
  Activation out = x;
  for (size_t begin = 0; begin < layers.size(); begin += interval) {
    const size_t end = std::min(layers.size(), begin + static_cast<size_t>(interval));
    auto run = [&layers, begin, end](const std::vector<at::Tensor>& in) {
      Activation a = in;
      for (size_t i = begin; i < end; ++i) a = layers[i].forward_tuple(a);
      return a;
    };
    // A segment whose inputs need no gradient (the first stage's token ids) is run plainly:
    // its parameters' gradients need its recorded graph, which a checkpoint would not keep.
    const bool needs = std::any_of(out.begin(), out.end(), [](const at::Tensor& t) {
      return t.defined() && t.requires_grad();
    });
    out = needs ? activation_checkpointing::checkpoint(run, out) : run(out);
  }
  return out;
}

}  // namespace dscpp::pipe
