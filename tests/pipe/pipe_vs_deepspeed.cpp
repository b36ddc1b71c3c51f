// Our pipeline engine on deepspeed_pipe_oracle.py's model, weights, data and config:
// the 7 LayerSpecs Linear(8,16) ReLU Linear(16,16) ReLU Linear(16,16) ReLU Linear(16,4), every
// weight and bias set by the oracle's formula (no RNG), partition "uniform", MSE loss,
// micro-batches of 2, SGD lr 0.05, no clipping, fp32. The world is --stages x data ranks. For
// each ZeRO stage of --zero (comma-separated) a fresh module and engine train --steps batches;
// rank 0 prints one JSON line per stage: {"zero": z, "losses": [...]}.
#include <torch/torch.h>

#include <boost/program_options.hpp>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dscpp/comm/rendezvous.h"
#include "dscpp/pipe/pipeline_engine.h"

namespace po = boost::program_options;
using dscpp::nn::LayerSpec;

namespace {

constexpr int64_t kMicro = 2;

// deepspeed_pipe_oracle.py's weight_values: element i of layer L is
// (((i * 7 + L * 3) mod 19) - 9) / 32, plus 1/64 for a bias.
at::Tensor formula(at::IntArrayRef shape, int64_t layer, bool bias) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  auto i = torch::arange(n, torch::kLong);
  auto v = ((i * 7 + layer * 3) % 19 - 9).to(torch::kDouble) / 32.0 + (bias ? 1.0 / 64 : 0.0);
  return v.to(torch::kFloat).reshape(shape);
}

std::vector<LayerSpec> specs() {
  std::vector<LayerSpec> out;
  const std::vector<std::pair<int64_t, int64_t>> linears = {{8, 16}, {16, 16}, {16, 16}, {16, 4}};
  for (int64_t layer = 0; layer < 7; ++layer) {
    if (layer % 2 == 1) {
      out.push_back({"layers." + std::to_string(layer),
                     [] { return std::make_shared<torch::nn::Module>("ReLU"); },
                     [](torch::nn::Module&, const at::Tensor& x) { return torch::relu(x); },
                     "",
                     {}});
      continue;
    }
    const auto [in, o] = linears[layer / 2];
    out.push_back({"layers." + std::to_string(layer),
                   [in = in, o = o, layer] {
                     torch::nn::Linear l(in, o);
                     torch::NoGradGuard no_grad;
                     l->weight.copy_(formula(l->weight.sizes(), layer, false));
                     l->bias.copy_(formula(l->bias.sizes(), layer, true));
                     return l.ptr();
                   },
                   [](torch::nn::Module& m, const at::Tensor& x) {
                     return static_cast<torch::nn::LinearImpl&>(m).forward(x);
                   },
                   "",
                   {}});
  }
  return out;
}

// deepspeed_pipe_oracle.py's data(step, batch, dp_rank).
dscpp::pipe::MicroBatch data(int64_t step, int64_t batch, int64_t dp_rank) {
  auto idx = torch::arange(kMicro * 8, torch::kDouble).reshape({kMicro, 8}) + step * 1000 +
             batch * 100 + dp_rank * 37;
  return {{torch::sin(0.1 * idx).to(torch::kFloat)},
          torch::cos(0.1 * idx.slice(1, 0, 4)).to(torch::kFloat)};
}

}  // namespace

int main(int argc, char** argv) {
  int stages = 2, steps = 5, micro_batches = 4;
  std::string zero_list;
  po::options_description desc("pipe_vs_deepspeed");
  desc.add_options()("stages", po::value(&stages)->default_value(2), "pipeline stages")(
      "steps", po::value(&steps)->default_value(5), "batches")(
      "micro-batches", po::value(&micro_batches)->default_value(4), "gradient_accumulation_steps")(
      "zero", po::value(&zero_list)->default_value("0"), "ZeRO stages, comma-separated")(
      "local_rank", po::value<int>(), "set by the launcher");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  po::notify(vm);
  auto world = dscpp::comm::init_distributed();
  std::stringstream list(zero_list);
  for (std::string z; std::getline(list, z, ',');) {
    dscpp::pipe::PipelineOptions options(stages);
    options.group(world).partition_method("uniform").loss_fn(dscpp::pipe::loss_of(
        [](const at::Tensor& o, const at::Tensor& l) { return torch::mse_loss(o, l); }));
    dscpp::pipe::PipelineModule module(specs(), options);
    nlohmann::json cfg = {{"train_micro_batch_size_per_gpu", kMicro},
                          {"gradient_accumulation_steps", micro_batches},
                          {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.05}}}}},
                          {"gradient_clipping", 0.0},
                          {"zero_optimization", {{"stage", std::stoi(z)}}}};
    auto engine = dscpp::initialize(module, cfg);
    const int64_t d = engine.module().data_parallel_id();
    nlohmann::json losses = nlohmann::json::array();
    for (int64_t s = 0; s < steps; ++s) {
      int64_t b = 0;
      dscpp::pipe::DataIter it = [&] { return data(s, b++, d); };
      losses.push_back(engine.train_batch(it).item<double>());
    }
    if (world->rank() == 0)
      std::cout << nlohmann::json{{"zero", std::stoi(z)}, {"losses", losses}}.dump() << "\n"
                << std::flush;
  }
  return 0;
}
