// moe_cli CASE.safetensors...: runs nn::moe::MoE on each case file that
// moe_deepspeed_oracle.py writes (DeepSpeed's MoE state dict under its names, x, grad_out and
// the options as metadata; used_token where the case has one), back-propagates sum(output ·
// grad_out) + 0.37 · l_aux and writes CASE.out.safetensors: output, l_aux, exp_counts, capacity,
// routes (the chosen expert of each [token, choice], -1 where dropped), x's gradient and every
// parameter's gradient.
#include <ATen/ATen.h>
#include <torch/nn/modules/container/any.h>

#include <iostream>
#include <map>
#include <string>

#include "dscpp/nn/moe/moe.h"
#include "dscpp/runtime/checkpoint/safetensors.h"

namespace moe = dscpp::nn::moe;
using dscpp::checkpoint::load_safetensors;
using dscpp::checkpoint::NamedTensors;
using dscpp::checkpoint::save_safetensors;

namespace {

void run_case(const std::string& path) {
  auto file = load_safetensors(path);
  std::map<std::string, at::Tensor> in(file.tensors.begin(), file.tensors.end());
  auto& meta = file.metadata;
  auto num = [&](const std::string& key) { return std::stod(meta.at(key)); };
  const int64_t h = static_cast<int64_t>(num("hidden")), f = static_cast<int64_t>(num("ffn"));
  moe::MoEOptions o(h);
  o.expert(torch::nn::AnyModule(moe::ExpertMLP(moe::ExpertMLPOptions(h, f))))
      .num_experts(static_cast<int64_t>(num("num_experts")))
      .k(static_cast<int64_t>(num("k")))
      .capacity_factor(num("capacity_factor"))
      .eval_capacity_factor(num("eval_capacity_factor"))
      .min_capacity(static_cast<int64_t>(num("min_capacity")))
      .drop_tokens(meta.at("drop_tokens") == "1")
      .use_residual(meta.at("use_residual") == "1")
      .use_rts(false)
      .top2_2nd_expert_sampling(false);
  moe::MoE layer(o);
  layer->train(meta.at("train") == "1");
  {
    at::NoGradGuard no_grad;
    for (auto& item : layer->named_parameters()) {
      auto it = in.find("param." + item.key());
      if (it == in.end()) throw std::runtime_error("no DeepSpeed parameter named " + item.key());
      item.value().copy_(it->second);
    }
  }
  at::Tensor x = in.at("x").clone().requires_grad_(true);
  at::Tensor used = in.count("used_token") ? in.at("used_token") : at::Tensor();
  auto [out, l_aux, counts] = layer->forward(x, used);
  (out * in.at("grad_out")).sum().add(l_aux * 0.37).backward();

  // The routing again (a fresh forward of the gate, without gradients) for the routes.
  at::NoGradGuard no_grad;
  moe::Routing r = layer->deepspeed_moe->gate->forward(x.detach().reshape({-1, h}), 0, used);
  NamedTensors result = {{"output", out.detach()},
                         {"l_aux", l_aux.detach()},
                         {"exp_counts", counts},
                         {"capacity", at::scalar_tensor(r.capacity, at::kLong)},
                         {"routes", at::where(r.kept, r.indices, -1)},
                         {"grad.x", x.grad()}};
  for (auto& item : layer->named_parameters()) {
    const at::Tensor& p = item.value();
    result.emplace_back("grad." + item.key(), p.grad().defined() ? p.grad() : at::zeros_like(p));
  }
  save_safetensors(result, path.substr(0, path.size() - 12) + ".out.safetensors");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: moe_cli CASE.safetensors...\n";
    return 2;
  }
  try {
    for (int i = 1; i < argc; ++i) run_case(argv[i]);
  } catch (const std::exception& e) {
    std::cerr << "moe_cli: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
