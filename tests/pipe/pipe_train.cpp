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
#include "tests/pipe/pipe_models.h"
#include "tests/pipe/pipe_train_modes.h"

namespace po = boost::program_options;
using namespace pipe_test;

namespace {
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
