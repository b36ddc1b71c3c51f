// Shared by the tests of experts with tensor parallelism (tp_moe_engine.cpp,
// tp_moe_checkpoint.cpp): the case string, the tiny MoE GPT (hidden 64, 2 layers both MoE, 4
// experts of FFN 32, GPT-2's blocks), the ds_config (SGD with momentum, clipping active) and the
// training loss. Header-only, test code.
#pragma once

#include <ATen/ATen.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "dscpp/error.h"
#include "dscpp/model_zoo/gpt_config.h"
#include "dscpp/nn/aux_loss.h"
#include "tests/runtime/engine/tp_common.h"

namespace tp_moe_test {

using nlohmann::json;
namespace mz = dscpp::model_zoo;

constexpr int kMicro = 2, kSeq = 16;

struct Case {
  int ep = 2, k = 1, stage = 0, ga = 1;
  bool dropless = true, shared = false;
  bool sp = false;   // suffix p: sequence parallelism (at t > 1)
  bool aux = false;  // suffix a: sigmoid router, aux loss, z-loss and the expert bias (dropless)
  std::string name;
};

inline Case parse_case(const std::string& s) {
  Case c;
  c.name = s;
  int d = 0, sh = 0, end = 0;
  const dscpp::Error bad("tp_moe_engine: bad case '" + s +
                         "' (e<E>k<k>d<0|1>s<0|1>z<stage>g<ga>[p][a])");
  if (std::sscanf(s.c_str(), "e%dk%dd%ds%dz%dg%d%n", &c.ep, &c.k, &d, &sh, &c.stage, &c.ga, &end) !=
      6)
    throw bad;
  std::string rest = s.substr(static_cast<size_t>(end));
  if (!rest.empty() && rest[0] == 'p') c.sp = true, rest.erase(0, 1);
  if (!rest.empty() && rest[0] == 'a') c.aux = true, rest.erase(0, 1);
  if (!rest.empty()) throw bad;
  c.dropless = d != 0;
  c.shared = sh != 0;
  return c;
}

inline mz::GPTConfig moe_config(const Case& c, int t, int ep) {
  json j = tp_test::tiny(t, c.sp && t > 1).to_json();
  j["gelu_approximation"] = "none";  // Megatron's exact GELU, in the dense and expert MLPs
  j["num_experts"] = 4;
  j["moe_router_topk"] = c.k;
  j["moe_ffn_hidden_size"] = 32;
  if (c.shared) j["moe_shared_expert_intermediate_size"] = 64;
  if (!c.dropless) {
    j["moe_expert_capacity_factor"] = 0.5;
    j["moe_aux_loss_coeff"] = 0.01;
  }
  if (c.aux) {
    // Every balancing term at once; the bias rate large enough to change the routing in 20
    // steps (the bias needs the sigmoid router).
    j["moe_router_score_function"] = "sigmoid";
    j["moe_aux_loss_coeff"] = 0.01;
    j["moe_z_loss_coeff"] = 0.001;
    j["moe_router_enable_expert_bias"] = true;
    j["moe_router_bias_update_rate"] = 0.01;
  }
  j["parallelism"]["expert_model_parallel_size"] = ep;
  return mz::GPTConfig::from_json(j);
}

inline json ds_config(int micro, const Case& c, int stage) {
  return {{"train_micro_batch_size_per_gpu", micro},
          {"gradient_accumulation_steps", c.ga},
          // SGD with momentum: Adam would turn rounding noise of a zero gradient into steps.
          {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.3}, {"momentum", 0.9}}}}},
          {"gradient_clipping", 0.5},  // active every step: the norm reaches the weights
          {"zero_optimization",
           {{"stage", stage}, {"overlap_comm", stage % 2 == 1}, {"reduce_bucket_size", 20000}}},
          {"steps_per_print", 0}};
}

// A training forward's model loss and the MoE blocks' aux losses (undefined: none).
template <typename Engine, typename LossFn>
std::pair<at::Tensor, at::Tensor> train_losses(Engine& eng, const at::Tensor& rows,
                                               LossFn loss_of) {
  dscpp::nn::AuxLossScope aux;
  at::Tensor loss = loss_of(eng.forward(rows.narrow(1, 0, kSeq)), rows.narrow(1, 1, kSeq));
  return {loss, aux.sum()};
}

// Their sum: what a training step back-propagates.
template <typename Engine, typename LossFn>
at::Tensor train_loss(Engine& eng, const at::Tensor& rows, LossFn loss_of) {
  auto [loss, aux] = train_losses(eng, rows, loss_of);
  return aux.defined() ? loss + aux : loss;
}

}  // namespace tp_moe_test
