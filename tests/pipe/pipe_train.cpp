// Trains tiny LayerSpec models for the pipeline's single-rank oracle (pipe_oracle.py).
// --mode reference: plain LibTorch in one process (build_layers, the whole global batch per
// step, torch::optim::AdamW, clip_grad_norm_). --mode pipe: dscpp's PipelineModule and
// PipelineEngine on the launcher's ranks, for each case of --cases (a JSON list of
// {"name", "stages", "chunks", "config"}), one after another in the same world. Each rank
// of data index 0 writes {"stage", "losses", "params": {name: values}, ...} to
// <out>/<case>.stage<s>.json; the reference writes <out>/reference.json.
// --mode refusals: stage 3 and forward/backward/step are refused with their messages.
// --mode die: the last stage exits mid-step (the failure test).
// --mode schedules: ZB-H1 against 1F1B, bit for bit, clipped and with an fp16 overflow.
// --mode muon: "type": "Muon" on a pipeline against one rank (muon_cases()); with --out, also a
// checkpoint of it resumed there.
// Checkpoints (pipe_checkpoint_oracle.py): a case with "save_dir" and "save_at" saves after
// that many steps; one with "load_dir" loads first and trains on from the loaded step.
// --mode single: the non-pipeline engine on one rank loads a pipeline checkpoint (single()).
#include <torch/torch.h>

#include <fmt/format.h>

#include <atomic>
#include <boost/program_options.hpp>
#include <cstdlib>
#include <fstream>
#include <iostream>

#include "dscpp/comm/rendezvous.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/model_zoo/gpt_tensor_parallel_specs.h"
#include "dscpp/nn/aux_loss.h"
#include "dscpp/nn/tensor_parallel_attr.h"
#include "dscpp/pipe/pipeline_engine.h"
#include "dscpp/runtime/engine/engine.h"
#include "dscpp/zero/zero_optimizer.h"

namespace po = boost::program_options;
using dscpp::nn::LayerSpec;
using nlohmann::json;

namespace {

constexpr int64_t kGlobalBatch = 16;
constexpr int64_t kBaseSeed = 1234;

// An MLP of 8 layers, 16 -> 32 x 6 -> 4, GELU/tanh between.
std::vector<LayerSpec> mlp_specs() {
  std::vector<LayerSpec> specs;
  const std::vector<int64_t> widths = {16, 32, 32, 32, 32, 32, 32, 32, 4};
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    const int64_t in = widths[i], out = widths[i + 1];
    const bool last = i + 2 == widths.size();
    specs.push_back({"layers." + std::to_string(i),
                     [in, out] { return torch::nn::Linear(in, out).ptr(); },
                     [last, i](torch::nn::Module& m, const at::Tensor& x) {
                       at::Tensor y = static_cast<torch::nn::LinearImpl&>(m).forward(x);
                       if (last) return y;
                       return i % 2 == 0 ? torch::gelu(y) : torch::tanh(y);
                     },
                     "",
                     {}});
  }
  return specs;
}

// The MLP's shape with a tuple activation: (hidden, mask), the mask a float tensor without
// gradient that every layer reads, and an auxiliary loss added by layer 3 (the side channel).
std::vector<LayerSpec> tuple_specs() {
  std::vector<LayerSpec> specs;
  const std::vector<int64_t> widths = {16, 32, 32, 32, 32, 32, 32, 32, 4};
  using dscpp::nn::Activation;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    const int64_t in = widths[i], out = widths[i + 1];
    LayerSpec spec{"layers." + std::to_string(i),
                   [in, out] { return torch::nn::Linear(in, out).ptr(); },
                   nullptr,
                   "",
                   {}};
    spec.forward_tuple = [i, last = i + 2 == widths.size()](torch::nn::Module& m,
                                                            const Activation& a) {
      auto& linear = static_cast<torch::nn::LinearImpl&>(m);
      if (i == 0) {
        at::Tensor h = torch::gelu(linear.forward(a.at(0)));
        return Activation{h, (h.detach() > 0.1).to(torch::kFloat)};
      }
      if (last) return Activation{linear.forward(a.at(0))};
      at::Tensor h = torch::tanh(linear.forward(a.at(0))) * (0.5 + 0.5 * a.at(1));
      if (i == 3) dscpp::nn::add_aux_loss(0.05 * h.pow(2).mean());
      return Activation{h, a.at(1)};
    };
    specs.push_back(std::move(spec));
  }
  return specs;
}

dscpp::model_zoo::GPTConfig gpt_config() {
  dscpp::model_zoo::GPTConfig c;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.num_layers = 6;  // 9 specs: embedding, 6 blocks, final norm, tied head
  c.num_attention_heads = 2;
  c.seq_length = 8;
  c.hidden_dropout = c.attention_dropout = 0.0;
  return c;
}

// "gpt3d": the tiny GPT of the 3D tests (hidden 64, 4 heads, 4 layers), whole on one
// rank or tensor-parallel over a model group.
// A case's "sp" and "checkpoint_activations" turn on sequence parallelism and per-block
// activation checkpointing (the same numbers: the reference has neither).
dscpp::model_zoo::GPTConfig gpt3d_config(int t = 1, bool sp = false, bool checkpointed = false) {
  dscpp::model_zoo::GPTConfig c = gpt_config();
  c.vocab_size = 64;
  c.hidden_size = 64;
  c.num_layers = 4;
  c.num_attention_heads = 4;
  c.parallelism.tensor_model_parallel_size = t;
  c.parallelism.sequence_parallel = sp;
  c.checkpoint_activations = checkpointed;
  return c;
}

using GroupPtr = std::shared_ptr<dscpp::comm::ProcessGroup>;

// model_group: the tensor-parallel group of a "gpt3d" case (null: the one-rank GPT); c: the
// case (its "sp" and "checkpoint_activations").
std::vector<LayerSpec> specs_of(const std::string& model, const GroupPtr& model_group = nullptr,
                                const json& c = json::object()) {
  if (model == "mlp") return mlp_specs();
  if (model == "tuple") return tuple_specs();
  if (model == "gpt3d") {
    const bool sp = c.value("sp", false), checkpointed = c.value("checkpoint_activations", false);
    if (!model_group)
      return dscpp::model_zoo::gpt_layer_specs(gpt3d_config(1, false, checkpointed));
    return dscpp::model_zoo::tensor_parallel_gpt_layer_specs(
        gpt3d_config(model_group->size(), sp, checkpointed), model_group);
  }
  return dscpp::model_zoo::gpt_layer_specs(gpt_config());
}

at::Tensor loss_of(const std::string& model, const at::Tensor& out, const at::Tensor& labels,
                   const GroupPtr& model_group = nullptr) {
  if (model != "gpt" && model != "gpt3d") return torch::mse_loss(out, labels);
  if (model_group) return dscpp::model_zoo::tensor_parallel_gpt_loss(out, labels, model_group);
  return dscpp::model_zoo::gpt_loss(out, labels, /*fused=*/false);
}

// Samples [first, first + count) of the model's data set: deterministic.
std::pair<at::Tensor, at::Tensor> samples(const std::string& model, int64_t first, int64_t count) {
  if (model != "gpt" && model != "gpt3d") {
    auto i = torch::arange(first, first + count, torch::kFloat).unsqueeze(1);
    auto x = torch::sin(i * 0.37 + torch::arange(16, torch::kFloat) * 0.11);
    auto y = torch::cos(i * 0.21 + torch::arange(4, torch::kFloat) * 0.5);
    return {x, y};
  }
  auto i = torch::arange(first, first + count, torch::kLong).unsqueeze(1);
  auto j = torch::arange(8, torch::kLong);
  auto tokens = (i * 7 + j * 3 + (i * j) % 5) % 32;  // < every GPT's vocabulary
  return {tokens, (tokens * 5 + 1) % 32};
}

json optimizer_config(const std::string& model) {
  // The tensor-parallel GPT: SGD with momentum, as tp_engine's oracle. Some gradients are zero
  // in exact arithmetic (the key bias's: softmax ignores it) and a few ulps apart across
  // layouts (the shards' partial sums add in another order); Adam would turn that noise into
  // steps of lr.
  if (model == "gpt3d") return {{"type", "SGD"}, {"params", {{"lr", 0.03}, {"momentum", 0.9}}}};
  // As the engine's oracle: the GPT's gradients near Adam's eps amplify 1-ulp differences,
  // so its runs use eps 1e-4.
  return {{"type", "AdamW"},
          {"params",
           {{"lr", 1e-2},
            {"betas", {0.9, 0.999}},
            {"eps", model == "mlp" || model == "tuple" ? 1e-8 : 1e-4},
            {"weight_decay", 0.01}}}};
}

std::vector<double> flat(const at::Tensor& t) {
  auto d = t.detach().to(torch::kCPU, torch::kDouble).flatten().contiguous();
  return {d.data_ptr<double>(), d.data_ptr<double>() + d.numel()};
}

void write(const std::string& path, const json& j) {
  std::ofstream(path) << j.dump();
}

void reference(const std::string& model, int steps, const std::string& out) {
  auto specs = specs_of(model);
  // seed_layers: layer i is built right after manual_seed(base_seed + i); tied specs share
  // the first one's module.
  std::vector<dscpp::nn::Layer> layers;
  std::map<std::string, std::shared_ptr<torch::nn::Module>> tied;
  auto root = std::make_shared<torch::nn::Module>();
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& s = specs[i];
    std::shared_ptr<torch::nn::Module> m;
    if (!s.tied_key.empty() && tied.count(s.tied_key)) {
      m = tied[s.tied_key];
    } else {
      torch::manual_seed(kBaseSeed + static_cast<int64_t>(i));
      m = s.build();
      if (!s.tied_key.empty()) tied[s.tied_key] = m;
      root->register_module("l" + std::to_string(i), m);
    }
    dscpp::nn::Layer layer{s.name, m, {}, {}};
    dscpp::nn::bind_forward(s, m, layer);
    layers.push_back(std::move(layer));
  }
  json cfg = optimizer_config(model)["params"];
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (model == "gpt3d") {
    optimizer = std::make_unique<torch::optim::SGD>(
        root->parameters(),
        torch::optim::SGDOptions(cfg["lr"].get<double>()).momentum(cfg["momentum"].get<double>()));
  } else {
    optimizer = std::make_unique<torch::optim::AdamW>(
        root->parameters(), torch::optim::AdamWOptions(cfg["lr"].get<double>())
                                .betas({0.9, 0.999})
                                .eps(cfg["eps"].get<double>())
                                .weight_decay(0.01));
  }
  auto& opt = *optimizer;
  json result;
  result["losses"] = json::array();
  result["grad_norms"] = json::array();
  for (int s = 0; s < steps; ++s) {
    auto [x, y] = samples(model, s * kGlobalBatch, kGlobalBatch);
    opt.zero_grad();
    dscpp::nn::AuxLossScope aux;
    at::Tensor loss = loss_of(model, dscpp::nn::run_layers(layers, dscpp::nn::Activation{x})[0], y);
    (aux.sum().defined() ? loss + aux.sum() : loss).backward();
    const double norm = torch::nn::utils::clip_grad_norm_(root->parameters(), 1.0);
    opt.step();
    result["losses"].push_back(loss.item<double>());
    result["grad_norms"].push_back(norm);
  }
  {  // eval_batch's oracle: the next global batch's loss under the final weights
    torch::NoGradGuard no_grad;
    dscpp::nn::AuxLossScope aux;
    auto [x, y] = samples(model, steps * kGlobalBatch, kGlobalBatch);
    result["eval_loss"] =
        loss_of(model, dscpp::nn::run_layers(layers, dscpp::nn::Activation{x})[0], y)
            .item<double>();
  }
  // Parameters under their whole-model names (spec name + key inside the layer).
  result["params"] = json::object();
  std::set<const torch::nn::Module*> seen;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!seen.insert(layers[i].module.get()).second) continue;
    for (const auto& item : layers[i].module->named_parameters(true))
      result["params"][specs[i].name + "." + item.key()] = flat(item.value());
  }
  write(out + "/reference.json", result);
}

json pipe_case(const std::shared_ptr<dscpp::comm::ProcessGroup>& world, const std::string& model,
               const json& c, int steps) {
  dscpp::pipe::PipelineOptions options(c["stages"].get<int>());
  // "model": the tensor-parallel degree t of a (pipe x data x model) topology; the groups are
  // made first, since the tensor-parallel layers are built on the model group.
  const int t = c.value("model", 1);
  GroupPtr model_group;
  if (t > 1) {
    const int p = c["stages"].get<int>();
    auto groups = dscpp::pipe::make_parallel_groups(
        world, dscpp::pipe::pipe_model_data_topology(p, t, world->size() / (p * t)),
        c.value("chunks", 1));
    model_group = groups->model;
    options.groups(groups);
  }
  options.group(world)
      .num_chunks(c.value("chunks", 1))
      .v_shape(c.value("v_shape", false))
      .seed_layers(true)
      .base_seed(kBaseSeed)
      .partition_method(c.value("partition", "parameters"))
      .activation_checkpoint_interval(c.value("checkpoint_interval", 0))
      .loss_fn(dscpp::pipe::loss_of([model, model_group](const at::Tensor& o, const at::Tensor& l) {
        return loss_of(model, o, l, model_group);
      }));
  dscpp::pipe::PipelineModule module(specs_of(model, model_group, c), options);
  json cfg = c["config"];
  cfg["train_batch_size"] = kGlobalBatch;
  cfg["gradient_clipping"] = 1.0;
  cfg["optimizer"] = optimizer_config(model);
  if (c.value("universal", false)) cfg["checkpoint"] = {{"load_universal", true}};
  auto engine = dscpp::initialize(module, cfg);
  const int64_t mb = engine.train_micro_batch_size_per_gpu();
  const int d = engine.module().data_parallel_id(), n = engine.module().data_parallel_size();
  json result;
  result["stage"] = engine.stage_id();
  result["losses"] = json::array();
  // Checkpoint cases: load first (training goes on from the loaded step), save after step
  // save_at.
  if (c.contains("load_dir")) (void)engine.load_checkpoint(c["load_dir"].get<std::string>());
  result["start"] = engine.global_steps();
  for (int s = static_cast<int>(engine.global_steps()); s < steps; ++s) {
    if (c.contains("save_dir") && s == c["save_at"].get<int>())
      engine.save_checkpoint(c["save_dir"].get<std::string>());
    int64_t j = 0;
    dscpp::pipe::DataIter it = [&]() {
      auto [x, y] = samples(model, s * kGlobalBatch + (j++ * n + d) * mb, mb);
      return dscpp::pipe::MicroBatch{{x}, y};
    };
    at::Tensor loss = engine.train_batch(it);
    result["losses"].push_back(loss.item<double>());
    result["grad_norms"].push_back(engine.get_global_grad_norm());
  }
  // save_at == steps: the final weights, those eval_batch sees below.
  if (c.contains("save_dir") && c["save_at"].get<int>() == steps)
    engine.save_checkpoint(c["save_dir"].get<std::string>());
  {
    int64_t j = 0;
    dscpp::pipe::DataIter it = [&]() {
      auto [x, y] = samples(model, steps * kGlobalBatch + (j++ * n + d) * mb, mb);
      return dscpp::pipe::MicroBatch{{x}, y};
    };
    result["eval_loss"] = engine.eval_batch(it).loss.item<double>();
  }
  result["params"] = json::object();
  result["shapes"] = json::object();
  result["tp"] = json::object();  // split parameters: [partition_dim, partition_stride]
  int64_t trainable = 0;
  const auto attrs = dscpp::nn::tensor_parallel_attributes(*engine.module().stage_module());
  for (const auto& item : engine.module().stage_module()->named_parameters(true)) {
    if (!item.value().requires_grad()) continue;
    result["params"][item.key()] = flat(item.value());
    result["shapes"][item.key()] = item.value().sizes().vec();
    const auto& a = attrs.at(item.key());
    if (a.tensor_model_parallel) result["tp"][item.key()] = {a.partition_dim, a.partition_stride};
    trainable += item.value().numel();
  }
  result["model_id"] = engine.module().model_parallel_id();
  auto& zo = engine.core().zero_optimizer();
  result["trainable_numel"] = trainable;
  result["partition"] = zo.layout().partition;
  result["total"] = zo.layout().total;
  result["state_numel"] = zo.optimizer().state_numel();
  result["bubble"] = engine.last_bubble_fraction();
  result["data_id"] = d;
  return result;
}

bool expect_refusal(const std::function<void()>& f, const std::string& words) {
  try {
    f();
  } catch (const std::exception& e) {
    if (std::string(e.what()).find(words) != std::string::npos) return true;
    std::cerr << "refused with the wrong message: " << e.what() << "\n";
    return false;
  }
  std::cerr << "not refused: " << words << "\n";
  return false;
}

int refusals(const std::shared_ptr<dscpp::comm::ProcessGroup>& world) {
  dscpp::pipe::PipelineOptions options(world->size());
  options.group(world).loss_fn(dscpp::pipe::loss_of(
      [](const at::Tensor& o, const at::Tensor& l) { return torch::mse_loss(o, l); }));
  dscpp::pipe::PipelineModule module(mlp_specs(), options);
  json cfg = {{"train_batch_size", 4}, {"optimizer", optimizer_config("mlp")}};
  bool ok = true;
  json stage3 = cfg;
  stage3["zero_optimization"] = {{"stage", 3}};
  ok &= expect_refusal([&] { (void)dscpp::initialize(module, stage3); },
                       "zero_optimization.stage: 3 with a pipeline is refused");
  json stages = cfg;
  stages["pipeline"] = {{"stages", world->size() + 1}};
  ok &= expect_refusal([&] { (void)dscpp::initialize(module, stages); },
                       "pipeline.stages: " + std::to_string(world->size() + 1) +
                           " but the PipelineModule has " + std::to_string(world->size()));
  auto engine = dscpp::initialize(module, cfg);
  ok &= expect_refusal([&] { engine.forward(); }, "inside train_batch(data_iter)");
  ok &= expect_refusal([&] { engine.backward(); }, "inside train_batch(data_iter)");
  ok &= expect_refusal([&] { engine.step(); }, "train_batch(data_iter) steps");
  std::cout << (ok ? "refusals: all as expected\n" : "refusals: FAILED\n") << std::flush;
  return ok ? 0 : 1;
}

int die(const std::shared_ptr<dscpp::comm::ProcessGroup>& world) {
  // The last stage's layer exits the process in the forward of step 3's second micro-batch:
  // its neighbours are blocked in a receive from it.
  auto specs = mlp_specs();
  int forwards = 0;
  const bool last = world->rank() == world->size() - 1;
  auto f = specs.back().forward;
  specs.back().forward = [f, &forwards, last](torch::nn::Module& m, const at::Tensor& x) {
    if (last && ++forwards == 2 * 2 + 2) {
      std::cerr << "pipe_train: the last stage exits mid-step\n" << std::flush;
      std::_Exit(3);
    }
    return f(m, x);
  };
  dscpp::pipe::PipelineOptions options(world->size());
  options.group(world).loss_fn(dscpp::pipe::loss_of(
      [](const at::Tensor& o, const at::Tensor& l) { return torch::mse_loss(o, l); }));
  dscpp::pipe::PipelineModule module(specs, options);
  json cfg = {{"train_batch_size", 8},
              {"gradient_accumulation_steps", 4},
              {"optimizer", optimizer_config("mlp")}};
  auto engine = dscpp::initialize(module, cfg);
  for (int s = 0; s < 10; ++s) {
    int64_t j = 0;
    dscpp::pipe::DataIter it = [&]() {
      auto [x, y] = samples("mlp", s * 8 + j++ * 2, 2);
      return dscpp::pipe::MicroBatch{{x}, y};
    };
    try {
      (void)engine.train_batch(it);
    } catch (const std::exception& e) {
      std::cerr << "pipe_train: caught at step " << s << ": " << e.what() << "\n" << std::flush;
      return 2;
    }
  }
  return 0;
}

// fp16: a layer on the last stage whose weight's gradient overflows while every other gradient
// (stage 0's included) stays finite. The verdict must be the whole model's: both stages skip
// both steps, stage 0's weights do not move, and the loss scales agree.
int overflow(const std::shared_ptr<dscpp::comm::ProcessGroup>& world) {
  auto specs = mlp_specs();
  specs.push_back({"spike",
                   [] {
                     auto m = std::make_shared<torch::nn::Module>();
                     m->register_parameter("w", torch::zeros({1}));
                     return m;
                   },
                   [](torch::nn::Module& m, const at::Tensor& x) {
                     // Adds nothing; its gradient is 60000 x the sum of the output's.
                     at::Tensor w = m.named_parameters()["w"];
                     return x + (w - w.detach()) * 60000.0;
                   },
                   "",
                   {}});
  dscpp::pipe::PipelineOptions options(world->size());
  options.group(world).partition_method("uniform").loss_fn(
      dscpp::pipe::loss_of([](const at::Tensor& o, const at::Tensor& l) {
        return torch::mse_loss(o.to(at::kFloat), l);
      }));
  dscpp::pipe::PipelineModule module(specs, options);
  json cfg = {{"train_batch_size", 8},
              {"gradient_accumulation_steps", 2},
              {"fp16", {{"enabled", true}, {"initial_scale_power", 4}}},
              {"optimizer", optimizer_config("mlp")}};
  auto engine = dscpp::initialize(module, cfg);
  auto params = [&] {
    std::vector<double> all;
    for (const auto& p : engine.module().stage_module()->parameters()) {
      auto v = flat(p);
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  const auto before = params();
  for (int s = 0; s < 2; ++s) {
    int64_t j = 0;
    dscpp::pipe::DataIter it = [&]() {
      auto [x, y] = samples("mlp", s * 8 + j++ * 4, 4);
      return dscpp::pipe::MicroBatch{{x.to(at::kHalf)}, y};
    };
    (void)engine.train_batch(it);
  }
  const bool unchanged = params() == before;
  at::Tensor mine = torch::tensor({static_cast<double>(engine.core().skipped_steps()),
                                   engine.loss_scale(), unchanged ? 1.0 : 0.0},
                                  torch::kDouble);
  at::Tensor all = torch::zeros({3 * world->size()}, torch::kDouble);
  world->all_gather(all, mine).wait();
  bool ok = true;
  for (int r = 0; r < world->size(); ++r) {
    ok &= all[3 * r].item<double>() == 2 && all[3 * r + 2].item<double>() == 1;
    ok &= all[3 * r + 1].item<double>() == all[1].item<double>();
  }
  if (world->rank() == 0)
    std::cout << (ok ? "overflow: every stage skipped both steps alike\n" : "overflow: FAILED\n")
              << all << "\n"
              << std::flush;
  return ok ? 0 : 1;
}

}  // namespace

// The non-pipeline engine on one rank over the whole model (the stage module of a one-stage
// PipelineModule: the same parameter names), loading a pipeline checkpoint and training on
// from its step with the whole global batch per step: the one-rank oracle of a pipeline
// checkpoint loaded onto another layout. Writes <out>/<name>.json with the weights right after
// the load (loaded_params) and at the end.
int single(const std::shared_ptr<dscpp::comm::ProcessGroup>& world, const std::string& model,
           const json& c, int steps, const std::string& out) {
  dscpp::pipe::PipelineOptions options(1);
  options.group(world).seed_layers(true).base_seed(kBaseSeed);
  dscpp::pipe::PipelineModule module(specs_of(model), options);
  json cfg = c["config"];
  cfg["train_batch_size"] = kGlobalBatch;
  cfg["train_micro_batch_size_per_gpu"] = kGlobalBatch;
  cfg["gradient_accumulation_steps"] = 1;
  cfg["gradient_clipping"] = 1.0;
  cfg["optimizer"] = optimizer_config(model);
  // "universal": the load_dir's latest_universal (tools/to_universal's output) is loaded.
  if (c.value("universal", false)) cfg["checkpoint"] = {{"load_universal", true}};
  auto stage = module.stage_module();
  auto engine = dscpp::initialize(stage, cfg);
  auto params = [&] {
    json p = json::object();
    for (const auto& item : stage->named_parameters(true))
      if (item.value().requires_grad()) p[item.key()] = flat(item.value());
    return p;
  };
  try {
    (void)engine.load_checkpoint(c["load_dir"].get<std::string>());
  } catch (const std::exception& e) {
    std::cerr << "pipe_train single: load refused: " << e.what() << "\n";
    return 4;
  }
  json result;
  result["start"] = engine.global_steps();
  result["loaded_params"] = params();
  result["losses"] = json::array();
  for (int s = static_cast<int>(engine.global_steps()); s < steps; ++s) {
    auto [x, y] = samples(model, s * kGlobalBatch, kGlobalBatch);
    at::Tensor loss = loss_of(model, module.forward_chunk(0, {x})[0], y);
    engine.backward(loss);
    engine.step();
    result["losses"].push_back(loss.item<double>());
  }
  result["params"] = params();
  write(out + "/" + c["name"].get<std::string>() + ".json", result);
  return 0;
}

// ZB-H1 against 1F1B on the same pipeline (the tiny GPT, whose linears put their weight
// products off to W), bit for bit: fp32 with gradient clipping that clips every step, and fp16
// with a step whose gradient overflows (a spike layer after the embedding adding nothing, its
// weight's gradient g_spike times the stream's dot product with its gradient; g_spike is 0 on
// the other steps). Losses, global
// norms, skipped steps, loss scales and this stage's weights must be equal.
std::atomic<double> g_spike{0};

json train_with_schedule(const std::shared_ptr<dscpp::comm::ProcessGroup>& world,
                         const std::string& schedule, bool fp16) {
  auto specs = specs_of("gpt");
  if (fp16)
    specs.insert(specs.begin() + 1, LayerSpec{"spike",
                                              [] {
                                                auto m = std::make_shared<torch::nn::Module>();
                                                m->register_parameter("w", torch::zeros({1}));
                                                return m;
                                              },
                                              [](torch::nn::Module& m, const at::Tensor& x) {
                                                at::Tensor w = m.named_parameters()["w"];
                                                return x + (w - w.detach()) * g_spike.load() * x;
                                              },
                                              "",
                                              {}});
  dscpp::pipe::PipelineOptions options(world->size());
  options.group(world).seed_layers(true).base_seed(kBaseSeed).loss_fn(
      dscpp::pipe::loss_of([](const at::Tensor& o, const at::Tensor& l) {
        return loss_of("gpt", o.to(at::kFloat), l);
      }));
  dscpp::pipe::PipelineModule module(specs, options);
  json cfg = {{"train_batch_size", kGlobalBatch},
              {"gradient_accumulation_steps", 8},
              {"gradient_clipping", 0.05},
              {"optimizer", optimizer_config("gpt")},
              {"pipeline", {{"schedule", schedule}}}};
  if (fp16) cfg["fp16"] = {{"enabled", true}, {"initial_scale_power", 8}};
  auto engine = dscpp::initialize(module, cfg);
  json r;
  for (int s = 0; s < 4; ++s) {
    g_spike = fp16 && s == 1 ? 1e5 : 0.0;
    int64_t j = 0;
    dscpp::pipe::DataIter it = [&]() {
      auto [x, y] = samples("gpt", s * kGlobalBatch + j++ * 2, 2);
      return dscpp::pipe::MicroBatch{{x}, y};
    };
    r["losses"].push_back(engine.train_batch(it).item<double>());
    r["norms"].push_back(engine.get_global_grad_norm());
  }
  r["skipped"] = engine.core().skipped_steps();
  r["scale"] = engine.loss_scale();
  for (const auto& item : engine.module().stage_module()->named_parameters())
    r["params"][item.key()] = flat(item.value());
  return r;
}

int schedules_agree(const std::shared_ptr<dscpp::comm::ProcessGroup>& world) {
  bool ok = true;
  std::string report;
  for (bool fp16 : {false, true}) {
    const json a = train_with_schedule(world, "1f1b", fp16);
    const json b = train_with_schedule(world, "zb-h1", fp16);
    bool same = a == b;
    // The cases must be what they claim: every fp32 step clipped; one fp16 step skipped.
    for (const auto& n : a["norms"]) same &= fp16 || n.get<double>() > 0.05;
    if (fp16) same &= a["skipped"].get<int64_t>() == 1;
    ok &= same;
    report += fmt::format(" {}: {} (norms {}, skipped {}, scale {});", fp16 ? "fp16" : "fp32",
                          same ? "equal" : "DIFFERENT", a["norms"].dump(), a["skipped"].dump(),
                          a["scale"].dump());
  }
  at::Tensor all = torch::full({1}, ok ? 1.0 : 0.0, torch::kDouble);
  world->all_reduce(all, dscpp::comm::ReduceOp::kMin).wait();
  ok = all.item<double>() == 1.0;
  if (world->rank() == 0)
    std::cout << (ok ? "schedules: zb-h1 equals 1f1b bit for bit:" : "schedules: FAILED:") << report
              << "\n"
              << std::flush;
  return ok ? 0 : 1;
}

// Muon on a pipeline: each stage's engine steps its stage's matrices whole (the Muon partition
// of its ZeRO set) and its biases with the auxiliary Adam, the norm over every stage. Against
// the non-pipeline engine over the whole MLP on the stage's data group, each data rank the same
// micro-batches accumulated: losses and weights within 1e-5 after `steps` steps (no clipping:
// the norm's summation order differs between the layouts, and Newton-Schulz in half precision
// would turn a clip coefficient's last bit into a rounding flip; they come out equal).
int muon_cases(const std::shared_ptr<dscpp::comm::ProcessGroup>& world, const json& cases,
               int steps, const std::string& checkpoint_dir) {
  GroupPtr self;
  for (int r = 0; r < world->size(); ++r)
    if (auto g = world->new_subgroup({r})) self = g;
  const json muon = {{"type", "Muon"},
                     {"params", {{"lr", 0.02}, {"momentum", 0.95}, {"weight_decay", 0.01}}}};
  bool ok = true;
  for (const auto& c : cases) {
    const int p = c["stages"], m = c["micro_batches"], z = c["zero"];
    const std::string schedule = c.value("schedule", "auto");
    const int d = world->size() / p;
    const int64_t mb = kGlobalBatch / (m * d);
    const json optimizer = c.value("optimizer", muon);
    dscpp::pipe::PipelineOptions options(p);
    options.group(world)
        .num_chunks(c.value("chunks", 1))
        .v_shape(schedule == "zb-v")
        .partition_method("uniform")
        .seed_layers(true)
        .base_seed(kBaseSeed)
        .loss_fn(dscpp::pipe::loss_of(
            [](const at::Tensor& o, const at::Tensor& l) { return torch::mse_loss(o, l); }));
    dscpp::pipe::PipelineModule module(mlp_specs(), options);
    // The reference: the whole MLP without a pipeline on this stage's data group (its ranks
    // reduce as the pipeline's do), each data rank the same micro-batches in the same order.
    dscpp::pipe::PipelineOptions ref_options(1);
    ref_options.group(self).seed_layers(true).base_seed(kBaseSeed);
    dscpp::pipe::PipelineModule ref_module(mlp_specs(), ref_options);
    auto ref_stage = ref_module.stage_module();
    dscpp::InitArgs data_ranks;
    data_ranks.group = module.data_group();
    auto ref = dscpp::initialize(ref_stage,
                                 json{{"train_batch_size", kGlobalBatch},
                                      {"train_micro_batch_size_per_gpu", mb},
                                      {"optimizer", optimizer},
                                      {"zero_optimization", {{"stage", z}}}},
                                 data_ranks);
    auto engine = dscpp::initialize(module, json{{"train_batch_size", kGlobalBatch},
                                                 {"train_micro_batch_size_per_gpu", mb},
                                                 {"optimizer", optimizer},
                                                 {"zero_optimization", {{"stage", z}}},
                                                 {"pipeline", {{"schedule", schedule}}}});
    const int rank = engine.module().data_parallel_id();
    double worst_loss = 0;
    for (int s = 0; s < steps; ++s) {
      at::Tensor ref_loss = torch::zeros({1}, torch::kDouble);
      for (int j = 0; j < m; ++j) {
        auto [x, y] = samples("mlp", s * kGlobalBatch + (j * d + rank) * mb, mb);
        at::Tensor loss = torch::mse_loss(ref_module.forward_chunk(0, {x})[0], y);
        ref.backward(loss);
        ref.step();
        ref_loss += loss.item<double>() / m;
      }
      module.data_group()->all_reduce(ref_loss, dscpp::comm::ReduceOp::kAvg).wait();
      int64_t j = 0;
      dscpp::pipe::DataIter it = [&]() {
        auto [x, y] = samples("mlp", s * kGlobalBatch + (j++ * d + rank) * mb, mb);
        return dscpp::pipe::MicroBatch{{x}, y};
      };
      const double got = engine.train_batch(it).item<double>();
      const double want = ref_loss.item<double>();
      worst_loss = std::max(worst_loss, std::abs(got - want) / std::abs(want));
    }
    double worst_weight = 0;
    auto ref_params = ref_stage->named_parameters(true);
    for (const auto& item : engine.module().stage_module()->named_parameters(true)) {
      const at::Tensor want = ref_params[item.key()].detach().to(torch::kDouble);
      const at::Tensor got = item.value().detach().to(torch::kDouble);
      worst_weight =
          std::max(worst_weight,
                   ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item<double>());
    }
    // The Muon partition holds this stage's matrices; the Adam half the rest.
    const bool has_muon =
        engine.core().zero_partitions().size() == (optimizer["type"] == "Muon" ? 2u : 1u);
    at::Tensor mine =
        torch::tensor({worst_loss, worst_weight, has_muon ? 0.0 : 1.0}, torch::kDouble);
    world->all_reduce(mine, dscpp::comm::ReduceOp::kMax).wait();
    const bool pass = mine[0].item<double>() <= 1e-5 && mine[1].item<double>() <= 1e-5 &&
                      mine[2].item<double>() == 0.0;
    ok &= pass;
    if (world->rank() == 0)
      std::cout << fmt::format("muon: {} {}: losses {:.1e}, weights {:.1e} from no pipeline{}\n",
                               pass ? "PASS" : "FAIL", c["name"].get<std::string>(),
                               mine[0].item<double>(), mine[1].item<double>(),
                               mine[2].item<double>() == 0.0 ? "" : " (the partitions are wrong)")
                << std::flush;
  }
  // A pipeline's checkpoint of a Muon run (its stages' Muon and Adam groups): a fresh engine that
  // loads it after step 2 trains step 3 as the saving one does, bit for bit.
  if (!checkpoint_dir.empty()) {
    auto make = [&] {
      dscpp::pipe::PipelineOptions options(2);
      options.group(world)
          .partition_method("uniform")
          .seed_layers(true)
          .base_seed(kBaseSeed)
          .loss_fn(dscpp::pipe::loss_of(
              [](const at::Tensor& o, const at::Tensor& l) { return torch::mse_loss(o, l); }));
      return dscpp::initialize(dscpp::pipe::PipelineModule(mlp_specs(), options),
                               json{{"train_batch_size", kGlobalBatch},
                                    {"gradient_accumulation_steps", 2},
                                    {"optimizer", muon},
                                    {"zero_optimization", {{"stage", 1}}}});
    };
    const int d = world->size() / 2;
    auto batch = [&](dscpp::pipe::PipelineEngine& e, int s) {
      int64_t j = 0;
      const int64_t mb = kGlobalBatch / (2 * d);
      const int rank = e.module().data_parallel_id();
      return e
          .train_batch([&]() {
            auto [x, y] = samples("mlp", s * kGlobalBatch + (j++ * d + rank) * mb, mb);
            return dscpp::pipe::MicroBatch{{x}, y};
          })
          .item<double>();
    };
    auto first = make();
    for (int s = 0; s < 2; ++s) (void)batch(first, s);
    first.save_checkpoint(checkpoint_dir);
    const double want = batch(first, 2);
    auto second = make();
    (void)second.load_checkpoint(checkpoint_dir);
    const double got = batch(second, 2);
    bool same = got == want;
    auto a = first.module().stage_module()->named_parameters(true);
    for (const auto& item : second.module().stage_module()->named_parameters(true))
      same &= at::equal(item.value(), a[item.key()]);
    at::Tensor flag = torch::full({1}, same ? 0.0 : 1.0, torch::kDouble);
    world->all_reduce(flag, dscpp::comm::ReduceOp::kMax).wait();
    same = flag.item<double>() == 0.0;
    ok &= same;
    if (world->rank() == 0)
      std::cout << "muon: " << (same ? "PASS" : "FAIL")
                << " a pipeline's Muon checkpoint resumes bit for bit (loss " << got << " against "
                << want << ")\n";
  }
  // A weight tied across stages stepped by Muon would miss the tied sum: refused, naming it.
  {
    dscpp::pipe::PipelineOptions options(world->size());
    options.group(world).seed_layers(true).loss_fn(dscpp::pipe::loss_of(
        [](const at::Tensor& o, const at::Tensor& l) { return loss_of("gpt", o, l); }));
    dscpp::pipe::PipelineModule module(specs_of("gpt"), options);
    dscpp::InitArgs args;
    args.use_muon = {{"embedding.word.weight", true}};
    std::string what;
    try {
      (void)dscpp::initialize(module,
                              json{{"train_batch_size", kGlobalBatch},
                                   {"gradient_accumulation_steps", 2},
                                   {"optimizer", muon}},
                              args);
    } catch (const std::exception& e) {
      what = e.what();
    }
    const bool named = what.find("tied weight 'embedding.word.weight'") != std::string::npos &&
                       what.find("muon partition") != std::string::npos;
    ok &= named;
    if (world->rank() == 0)
      std::cout << "muon: " << (named ? "PASS" : "FAIL")
                << " a weight tied across stages under Muon is refused: " << what << "\n";
  }
  if (world->rank() == 0)
    std::cout << (ok ? "muon: every case as without a pipeline\n" : "muon: FAILED\n") << std::flush;
  return ok ? 0 : 1;
}

int main(int argc, char** argv) {
  std::string mode, model, cases_text, out;
  int steps;
  po::options_description desc("pipe_train");
  desc.add_options()("mode", po::value(&mode)->required(), "reference, pipe, refusals or die")(
      "model", po::value(&model)->default_value("mlp"), "mlp, tuple, gpt or gpt3d")(
      "cases", po::value(&cases_text)->default_value("[]"), "pipe mode: JSON list of cases")(
      "steps", po::value(&steps)->default_value(20), "optimizer steps")(
      "out", po::value(&out)->default_value("."), "folder for the JSON results")(
      "local_rank", po::value<int>(), "set by the launcher");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  po::notify(vm);
  torch::manual_seed(1);
  if (mode == "reference") {
    reference(model, steps, out);
    return 0;
  }
  auto world = dscpp::comm::init_distributed();
  if (mode == "refusals") return refusals(world);
  if (mode == "die") return die(world);
  if (mode == "overflow") return overflow(world);
  if (mode == "schedules") return schedules_agree(world);
  if (mode == "muon")
    return muon_cases(world, json::parse(cases_text), steps,
                      out == "." ? std::string() : out + "/muon_pipe_checkpoint");
  if (mode == "single") return single(world, model, json::parse(cases_text).at(0), steps, out);
  for (const auto& c : json::parse(cases_text)) {
    json r = pipe_case(world, model, c, steps);
    if (r["data_id"] == 0)
      write(out + "/" + c["name"].get<std::string>() + ".stage" +
                std::to_string(r["stage"].get<int>()) +
                (c.value("model", 1) > 1 ? ".model" + std::to_string(r["model_id"].get<int>())
                                         : std::string()) +
                ".json",
            r);
    if (world->rank() == 0) std::cout << "case " << c["name"] << " done\n" << std::flush;
  }
  return 0;
}
