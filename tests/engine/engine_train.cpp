// Trains a tiny model for the single-rank oracle. --mode reference: plain LibTorch (no
// dscpp), one process, the whole global batch per step, torch::optim::AdamW and
// clip_grad_norm_. --mode dscpp: dscpp::initialize over the same model and data, run by the
// launcher on N ranks, each taking its micro-batches of the same global batch. Rank 0 writes
// {"losses": [...], "params": [...], "state_numel": n, "partition": n} as JSON to --out.
#include <torch/torch.h>

#include <boost/program_options.hpp>
#include <fstream>
#include <iostream>

#include "dscpp.h"
#include "optim/optimizer.h"
#include "zero/zero_optimizer.h"

namespace po = boost::program_options;
using nlohmann::json;

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    l1 = register_module("l1", torch::nn::Linear(16, 32));
    l2 = register_module("l2", torch::nn::Linear(32, 32));
    l3 = register_module("l3", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return l3(torch::tanh(l2(torch::gelu(l1(x))))); }
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr};
};
TORCH_MODULE(Mlp);

// Sample i of the data set: deterministic, so every process builds the same batches.
std::pair<torch::Tensor, torch::Tensor> samples(int64_t first, int64_t count) {
  auto i = torch::arange(first, first + count, torch::kFloat).unsqueeze(1);
  auto x = torch::sin(i * 0.37 + torch::arange(16, torch::kFloat) * 0.11);
  auto y = torch::cos(i * 0.21 + torch::arange(4, torch::kFloat) * 0.5);
  return {x, y};
}

std::vector<double> flat_params(torch::nn::Module& m) {
  std::vector<double> out;
  for (const auto& p : m.parameters()) {
    auto t = p.detach().to(torch::kCPU, torch::kDouble).flatten().contiguous();
    out.insert(out.end(), t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode, config_text, out_path;
  int steps;
  po::options_description desc("engine_train");
  desc.add_options()("mode", po::value(&mode)->required(), "init, reference or dscpp")(
      "config", po::value(&config_text)->default_value("{\"train_batch_size\": 1}"),
      "ds_config JSON text")("steps", po::value(&steps)->default_value(20), "optimizer steps")(
      "out", po::value(&out_path)->required(), "where rank 0 writes its JSON")(
      "local_rank", po::value<int>(), "set by the launcher");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  po::notify(vm);
  json cfg = json::parse(config_text);
  torch::manual_seed(1234);
  Mlp model;
  json result;
  const int64_t global_batch = cfg["train_batch_size"].get<int64_t>();

  if (mode == "init") {
    // The initial weights by name, for an outside trainer (DeepSpeed) to start from.
    for (const auto& item : model->named_parameters()) {
      auto t = item.value().detach().to(torch::kDouble).contiguous();
      result[item.key()] = {
          {"shape", t.sizes().vec()},
          {"values", std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel())}};
    }
  } else if (mode == "reference") {
    auto p = cfg["optimizer"]["params"];
    torch::optim::AdamW opt(model->parameters(),
                            torch::optim::AdamWOptions(p["lr"].get<double>())
                                .betas({p["betas"][0], p["betas"][1]})
                                .eps(p["eps"].get<double>())
                                .weight_decay(p["weight_decay"].get<double>()));
    const double clip = cfg.value("gradient_clipping", 1.0);
    for (int s = 0; s < steps; ++s) {
      auto [x, y] = samples(s * global_batch, global_batch);
      auto loss = torch::mse_loss(model->forward(x), y);
      opt.zero_grad();
      loss.backward();
      if (clip > 0) torch::nn::utils::clip_grad_norm_(model->parameters(), clip);
      opt.step();
      result["losses"].push_back(loss.item<double>());
    }
    result["params"] = flat_params(*model);
  } else {
    auto engine = dscpp::initialize(model, cfg);
    const int n = engine.world_size(), r = engine.global_rank();
    const int64_t mb = engine.train_micro_batch_size_per_gpu();
    const int64_t ga = engine.gradient_accumulation_steps();
    for (int s = 0; s < steps; ++s) {
      double loss_sum = 0;
      for (int64_t m = 0; m < ga; ++m) {
        auto [x, y] = samples(s * global_batch + (m * n + r) * mb, mb);
        // On a GPU (NCCL) and in fp16/bf16 the model lives there and in that type.
        auto dtype = model->parameters()[0].scalar_type();
        auto out = engine.forward(x.to(engine.device(), dtype)).to(torch::kFloat);
        auto loss = torch::mse_loss(out, y.to(engine.device()));
        engine.backward(loss);
        engine.step();
        loss_sum += loss.item<double>();
      }
      // The global batch's loss: the mean of every rank's micro-batch losses.
      auto l = torch::tensor({loss_sum / ga}, torch::kFloat64).to(engine.device());
      engine.core().group().all_reduce(l, dscpp::comm::ReduceOp::kAvg).wait();
      result["losses"].push_back(l.cpu().item<double>());
    }
    result["params"] = flat_params(*model);
    auto& zo = engine.core().zero_optimizer();
    result["state_numel"] = zo.optimizer().state_numel();
    result["partition"] = zo.layout().partition;
    result["total"] = zo.layout().total;
    if (r != 0) return 0;
  }
  std::ofstream(out_path) << result.dump() << "\n";
  return 0;
}
