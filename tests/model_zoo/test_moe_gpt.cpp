// The MoE GPT at expert degree 1 against a hand-built reference: with top-k = num_experts,
// dropless softmax routing (combine weights summing to one per token) and every expert holding
// the dense MLP's weights, each MoE block is exactly the dense block, so the MoE GPT equals the
// dense GPT with that MLP: logits, loss and every gradient (the experts' summing to the dense
// MLP's). The aux loss is hand-computed there too: each token picks every expert, so DeepSpeed's
// top-k l_aux = E^2/k * mean_e(me_e * 1) = 1 per layer.
#include "gpt_test_util.h"

#include "dscpp/nn/aux_loss.h"

using namespace gpt_test;

namespace {

// Blocks 0 and 2 MoE (moe_layer_freq as a list), 4 experts top-4, SwiGLU without biases.
json moe_json(double aux_coeff) {
  json j = small_json();
  j["swiglu"] = true;
  j["ffn_hidden_size"] = 48;
  j["add_bias_linear"] = false;
  j["normalization"] = "RMSNorm";
  j["num_experts"] = 4;
  j["moe_router_topk"] = 4;
  j["moe_layer_freq"] = json::array({1, 0, 1});
  j["moe_aux_loss_coeff"] = aux_coeff;
  return j;
}

json dense_json() {
  json j = moe_json(0.0);
  for (const char* k : {"num_experts", "moe_router_topk", "moe_layer_freq", "moe_aux_loss_coeff"})
    j.erase(k);
  return j;
}

const char* kExperts = ".mlp.deepspeed_moe.experts.";

// The MoE GPT's weights from the dense one: shared names copied, each MoE block's experts all
// given the dense block's MLP (weight1[e] = fc^T [h, 2f], weight2[e] = proj^T [f, h]).
void copy_dense_into_moe(mz::GPT& dense, mz::GPT& moe) {
  at::NoGradGuard no_grad;
  auto src = dense->named_parameters();
  for (auto& item : moe->named_parameters()) {
    const std::string& name = item.key();
    at::Tensor dst = item.value();
    if (const at::Tensor* p = src.find(name)) {
      dst.copy_(*p);
      continue;
    }
    const auto at = name.find(kExperts);
    if (at == std::string::npos) continue;  // the router: any weights do
    const std::string block = name.substr(0, at);
    const bool first = name.substr(name.size() - 7) == "weight1";
    const at::Tensor w = src[block + (first ? ".mlp.fc.weight" : ".mlp.proj.weight")];
    dst.copy_(w.t().unsqueeze(0).expand_as(dst));
  }
}

}  // namespace

TEST(MoEGPT, BlocksFollowMoeLayerFreqUnderDeepSpeedsNames) {
  mz::GPT moe(mz::GPTConfig::from_json(moe_json(0.0)));
  auto params = moe->named_parameters();
  EXPECT_NE(params.find("blocks.0.mlp.deepspeed_moe.gate.wg.weight"), nullptr);
  EXPECT_NE(params.find("blocks.0.mlp.deepspeed_moe.experts.weight1"), nullptr);
  EXPECT_NE(params.find("blocks.1.mlp.fc.weight"), nullptr);  // dense
  EXPECT_NE(params.find("blocks.2.mlp.deepspeed_moe.experts.weight2"), nullptr);
  EXPECT_EQ(params["blocks.2.mlp.deepspeed_moe.experts.weight1"].sizes(),
            (at::IntArrayRef{4, 32, 96}));
  EXPECT_EQ(count_parameters(*moe), moe->config().num_parameters());
  // Megatron's initialisation: normal(0, 0.02), the second product at 0.02 / sqrt(2 L).
  const double std2 = params["blocks.0.mlp.deepspeed_moe.experts.weight2"].std().item<double>();
  EXPECT_NEAR(std2, 0.02 / std::sqrt(6.0), 0.002);
  // The LayerSpec form builds the same blocks under the same names.
  dscpp::nn::LayerModule layered(mz::gpt_layer_specs(moe->config()));
  std::set<std::string> a, b;
  for (const auto& item : moe->named_parameters()) a.insert(item.key());
  for (const auto& item : layered->named_parameters()) b.insert(item.key());
  EXPECT_EQ(a, b);
}

TEST(MoEGPT, TopKAllIdenticalExpertsEqualTheDenseGPTAndAuxLossIsHandComputed) {
  at::manual_seed(1);
  mz::GPT dense(mz::GPTConfig::from_json(dense_json()));
  at::manual_seed(2);
  mz::GPT moe(mz::GPTConfig::from_json(moe_json(0.1)));
  copy_dense_into_moe(dense, moe);
  const at::Tensor ids = at::randint(61, {2, 16}, at::kLong);
  const at::Tensor targets = at::randint(61, {2, 16}, at::kLong);

  const at::Tensor dense_logits = dense->forward(ids);
  dense->loss(dense_logits, targets).backward();
  at::Tensor moe_logits, aux;
  {
    dscpp::nn::AuxLossScope scope;
    moe_logits = moe->forward(ids);
    aux = scope.sum();
    (moe->loss(moe_logits, targets) + aux).backward();
  }
  EXPECT_TRUE(at::allclose(moe_logits, dense_logits, 1e-5, 1e-6));
  // Two MoE layers, l_aux = 1 each, coefficient 0.1.
  ASSERT_TRUE(aux.defined());
  EXPECT_NEAR(aux.item<double>(), 0.2, 1e-6);

  auto dense_grads = grads_of(*dense);
  for (const auto& item : moe->named_parameters()) {
    const std::string& name = item.key();
    const at::Tensor g = item.value().grad();
    ASSERT_TRUE(g.defined()) << name;
    if (auto it = dense_grads.find(name); it != dense_grads.end()) {
      EXPECT_TRUE(at::allclose(g, it->second, 1e-4, 1e-6)) << name;
      continue;
    }
    const auto at = name.find(kExperts);
    if (at == std::string::npos) {
      // The router: the output does not depend on it (weights sum to one over identical
      // experts); only the aux loss reaches it, and l_aux = 1 whatever the scores.
      EXPECT_LT(g.abs().max().item<double>(), 1e-6) << name;
      continue;
    }
    const std::string block = name.substr(0, at);
    const bool first = name.substr(name.size() - 7) == "weight1";
    const at::Tensor want = dense_grads[block + (first ? ".mlp.fc.weight" : ".mlp.proj.weight")];
    EXPECT_TRUE(at::allclose(g.sum(0).t(), want, 1e-4, 1e-6)) << name;
  }

  // The log's statistics: every token chose every expert, once per layer.
  const auto stats = mz::take_moe_stats(*moe);
  ASSERT_EQ(stats.size(), 2u);
  for (const auto& s : stats) {
    EXPECT_EQ(s.forwards, 1);
    EXPECT_TRUE(at::equal(s.tokens_per_expert, at::full({4}, 32, at::kLong)));
    EXPECT_NEAR(s.l_aux.item<double>(), 1.0, 1e-6);
  }
  EXPECT_FALSE(mz::take_moe_stats(*moe)[0].tokens_per_expert.defined());  // reset by the take

  // Eval forwards add no aux loss (no scope needed) and count nothing.
  moe->eval();
  EXPECT_TRUE(at::allclose(moe->forward(ids), dense_logits, 1e-5, 1e-6));
  EXPECT_EQ(mz::take_moe_stats(*moe)[0].forwards, 0);
}

// A GPT-2-style model (GELU's tanh approximation, the default) takes experts without changing
// its dense blocks: with every expert holding the dense MLP, the MoE GPT equals the dense GPT,
// so the experts' GELU is the dense blocks' tanh one. The MLP weights are scaled up so that GELU
// sees inputs of order 1, where the tanh and exact forms differ, and that difference reaches the
// logits beyond the comparison's tolerance (checked: the exact-GELU GPT fails the comparison).
TEST(MoEGPT, Gpt2StyleExpertsUseTheDenseBlocksTanhGelu) {
  json moe_j = small_json();
  moe_j["add_bias_linear"] = false;  // the grouped experts have no biases
  json dense_j = moe_j;
  moe_j["num_experts"] = 4;
  moe_j["moe_router_topk"] = 4;
  moe_j["moe_layer_freq"] = json::array({1, 0, 1});
  moe_j["moe_aux_loss_coeff"] = 0.0;
  ASSERT_EQ(mz::GPTConfig::from_json(moe_j).gelu_approximation, "tanh");
  at::manual_seed(3);
  mz::GPT dense(mz::GPTConfig::from_json(dense_j));
  {
    at::NoGradGuard no_grad;
    for (auto& item : dense->named_parameters())
      if (item.key().find(".mlp.fc.weight") != std::string::npos)
        item.value().mul_(40.0);
      else if (item.key().find(".mlp.proj.weight") != std::string::npos)
        item.value().mul_(20.0);
  }
  mz::GPT moe(mz::GPTConfig::from_json(moe_j));
  copy_dense_into_moe(dense, moe);
  const at::Tensor ids = at::randint(61, {2, 16}, at::kLong);
  const at::Tensor dense_logits = dense->forward(ids);
  EXPECT_TRUE(at::allclose(moe->forward(ids), dense_logits, 1e-5, 1e-6));
  // The same weights under the exact GELU fail the same comparison.
  dense_j["gelu_approximation"] = "none";
  mz::GPT exact(mz::GPTConfig::from_json(dense_j));
  {
    at::NoGradGuard no_grad;
    auto src = dense->named_parameters();
    for (auto& item : exact->named_parameters()) item.value().copy_(src[item.key()]);
  }
  const at::Tensor exact_logits = exact->forward(ids);
  EXPECT_FALSE(at::allclose(exact_logits, dense_logits, 1e-5, 1e-6))
      << (exact_logits - dense_logits).abs().max().item<double>();
}

TEST(MoEGPT, ExpertDegreeAboveOneNeedsItsGroup) {
  json j = moe_json(0.0);
  j["parallelism"] = {{"expert_model_parallel_size", 2}};
  const auto cfg = mz::GPTConfig::from_json(j);
  const std::string e = config_error([&] { mz::GPT model(cfg); });
  EXPECT_NE(e.find("parallelism.expert_model_parallel_size"), std::string::npos) << e;
  EXPECT_NE(e.find("expert-parallel group of 2 ranks"), std::string::npos) << e;
  const std::string specs = config_error([&] { mz::gpt_layer_specs(cfg); });
  EXPECT_NE(specs.find("parallelism.expert_model_parallel_size"), std::string::npos) << specs;
  EXPECT_NE(specs.find("expert-parallel group of 2 ranks"), std::string::npos) << specs;
  // The tensor-parallel GPT implements GPT-2's blocks only: it names the key.
  json tp = moe_json(0.0);
  tp["parallelism"] = {{"tensor_model_parallel_size", 2}};
  EXPECT_EQ(mz::GPTConfig::from_json(tp).first_non_gpt2_block_key(), "normalization");
}
