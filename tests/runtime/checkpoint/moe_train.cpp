// Trains a tiny MoE model (Linear 8->16, DeepSpeed's MoE layer of 4 experts, top-2, dropless,
// Linear 16->4) through dscpp's engine on the launcher's ranks, for moe_checkpoint_oracle.py.
//   moe_train --config JSON --steps N --ep E [--grouped] [--load DIR] [--save DIR --save-at S]
//             --out OUT.json [--weights OUT.pt]
// Every rank builds the same model (seed 0) and takes its micro-batches of the same global
// batch. Rank 0 writes {"first_step", "losses": [global batch loss per step], "files": ...};
// --weights: rank 0's fp32 state dict after training (at ep 1 the one-rank model's); at ep > 1
// ranks 1..ep-1 write theirs (their own experts) to <weights>.rank<r> as well (at ZeRO 3
// gathered whole first).
#include <torch/torch.h>

#include <boost/program_options.hpp>
#include <fstream>
#include <iostream>
#include <optional>

#include "dscpp/comm/expert_groups.h"
#include "dscpp/comm/rendezvous.h"
#include "dscpp/comm/topology.h"
#include "dscpp/dscpp.h"
#include "dscpp/nn/moe/experts.h"
#include "dscpp/nn/moe/moe.h"
#include "dscpp/runtime/checkpoint/torch_file.h"

namespace po = boost::program_options;
namespace moe = dscpp::nn::moe;
using nlohmann::json;

namespace {

struct MoeNetImpl : torch::nn::Module {
  MoeNetImpl(int64_t ep, std::shared_ptr<dscpp::comm::ProcessGroup> ep_group, bool grouped) {
    in = register_module("in", torch::nn::Linear(8, 16));
    auto o = moe::MoEOptions(16)
                 .num_experts(4)
                 .k(2)
                 .capacity_factor(0.0)
                 .top2_2nd_expert_sampling(false)
                 .ep_size(ep)
                 .ep_group(ep > 1 ? ep_group : nullptr);
    if (grouped) {
      o.ffn_hidden_size(12);
    } else {
      o.expert(torch::nn::AnyModule(moe::ExpertMLP(moe::ExpertMLPOptions(16, 12))));
    }
    layer = register_module("moe", moe::MoE(o));
    out = register_module("out", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::tanh(in(x));
    return out(h + layer->forward(h).output);
  }
  torch::nn::Linear in{nullptr}, out{nullptr};
  moe::MoE layer{nullptr};
};
TORCH_MODULE(MoeNet);

std::pair<torch::Tensor, torch::Tensor> samples(int64_t first, int64_t count) {
  auto i = torch::arange(first, first + count, torch::kFloat).unsqueeze(1);
  auto x = torch::sin(i * 0.37 + torch::arange(8, torch::kFloat) * 0.41);
  auto y = torch::cos(i * 0.21 + torch::arange(4, torch::kFloat) * 0.5);
  return {x, y};
}

}  // namespace

int main(int argc, char** argv) {
  std::string config_text, load, save, out_path, weights;
  int steps = 0, save_at = -1;
  int64_t ep = 1;
  po::options_description desc("moe_train");
  desc.add_options()("config", po::value(&config_text)->required(), "ds_config JSON")(
      "steps", po::value(&steps)->required(), "optimizer steps")("ep", po::value(&ep), "ep_size")(
      "grouped", "GroupedMLP experts (default: clones of an ExpertMLP)")(
      "load", po::value(&load), "load this folder's latest first")("save", po::value(&save),
                                                                   "save into this folder")(
      "save-at", po::value(&save_at), "after this step")("out", po::value(&out_path)->required(),
                                                         "rank 0's JSON")(
      "weights", po::value(&weights), "the final fp32 state dict (a torch file)")(
      "local_rank", po::value<int>(), "the launcher's (ranks read the environment)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  po::notify(vm);
  try {
    auto world = dscpp::comm::init_distributed();
    const int n = world->size(), r = world->rank();
    std::shared_ptr<dscpp::comm::ProcessGroup> ep_group;
    if (ep > 1) {
      dscpp::comm::Topology topo({"data", "model"}, {n, 1});
      ep_group = dscpp::comm::new_expert_groups(*world, topo, static_cast<int>(ep)).expert_parallel;
    }
    // Every rank builds the same weights (at ep > 1 its experts are overwritten by a load).
    torch::manual_seed(0);
    MoeNet model(ep, ep_group, vm.count("grouped") > 0);
    dscpp::InitArgs args;
    args.group = world;
    auto engine = dscpp::initialize(model, json::parse(config_text), args);
    const int64_t global_batch = engine.train_batch_size();
    const int64_t mb = engine.train_micro_batch_size_per_gpu();
    const int64_t ga = engine.gradient_accumulation_steps();
    json result;
    int first = 0;
    if (!load.empty()) {
      engine.load_checkpoint(load);
      first = static_cast<int>(engine.global_steps());
    }
    result["first_step"] = first;
    result["losses"] = json::array();
    for (int s = first; s < steps; ++s) {
      double loss_sum = 0;
      for (int64_t m = 0; m < ga; ++m) {
        auto [x, y] = samples(s * global_batch + (m * n + r) * mb, mb);
        auto loss = torch::mse_loss(engine.forward(x), y);
        engine.backward(loss);
        engine.step();
        loss_sum += loss.item<double>();
      }
      auto l = torch::tensor({loss_sum / ga}, torch::kFloat64);
      world->all_reduce(l, dscpp::comm::ReduceOp::kAvg).wait();
      result["losses"].push_back(l.item<double>());
      if (s + 1 == save_at) engine.save_checkpoint(save);
    }
    if (!weights.empty()) {
      // Whole values (stage 3: gathered on every rank, the dense parameters by the engine's
      // scope, the experts at ep > 1 by their own ZeroOptimizer's; no-ops at stages 0-2).
      auto gathered = engine.gathered_parameters(model->parameters());
      std::optional<dscpp::zero::GatheredParameters> experts;
      if (auto* ez = engine.core().expert_zero_optimizer()) experts.emplace(*ez);
      if (r < ep) {
        auto sd = dscpp::checkpoint::PyValue::ordered_dict();
        for (const auto& p : model->named_parameters())
          sd.set(dscpp::checkpoint::PyValue(p.key()),
                 dscpp::checkpoint::PyValue(p.value().detach().to(torch::kFloat).clone()));
        dscpp::checkpoint::save_torch_file(
            sd, r == 0 ? weights : weights + ".rank" + std::to_string(r));
      }
    }
    if (r == 0) std::ofstream(out_path) << result.dump() << "\n";
    world->barrier().wait();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "moe_train: " << e.what() << "\n";
    return 1;
  }
}
