// nn::moe's layer pieces against references computed token by token: dropless output, the
// grouped MLP experts, LatentMoE with a shared expert, the aux-loss side channel, DeepSpeed's
// parameter names and independent expert clones, and the refusals. (DeepSpeed's MoE itself
// is the oracle of moe_deepspeed_oracle.py.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/any.h>

#include <cmath>
#include <string>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/nn/aux_loss.h"
#include "dscpp/nn/moe/moe.h"
#include "dscpp/ops/grouped_mm.h"

namespace moe = dscpp::nn::moe;
using torch::nn::AnyModule;

namespace {

double rel(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() /
         std::max(b.to(at::kDouble).abs().max().item<double>(), 1e-30);
}

// Σ_j w_sj · expert_{idx_sj}(z_s), one token and one route at a time.
at::Tensor per_token(const moe::Routing& r, const at::Tensor& z,
                     const std::function<at::Tensor(int64_t, const at::Tensor&)>& expert) {
  std::vector<at::Tensor> out;
  for (int64_t s = 0; s < z.size(0); ++s) {
    at::Tensor y;
    for (int64_t j = 0; j < r.indices.size(1); ++j) {
      at::Tensor v = expert(r.indices[s][j].item<int64_t>(), z.narrow(0, s, 1)) *
                     r.weights[s][j].item<double>();
      y = y.defined() ? y + v : v;
    }
    out.push_back(y);
  }
  return at::cat(out, 0);
}

}  // namespace

TEST(MoeLayer, DroplessEqualsPerTokenSum) {
  at::manual_seed(10);
  const int64_t h = 8;
  moe::MoE layer(moe::MoEOptions(h)
                     .expert(AnyModule(moe::ExpertMLP(moe::ExpertMLPOptions(h, 16))))
                     .num_experts(4)
                     .k(2)
                     .top2_2nd_expert_sampling(false)
                     .capacity_factor(0));
  {
    at::NoGradGuard g;
    for (auto& p : layer->parameters()) p.normal_();
    // Skewed: expert 0 is every token's first choice; dropless keeps every route anyway.
    layer->deepspeed_moe->gate->wg->weight[0].fill_(0).index_put_({0}, 50.0);
  }
  at::Tensor x = at::randn({2, 5, h});
  x.select(2, 0).fill_(1.0);
  auto out = layer->forward(x);
  moe::Routing r = layer->deepspeed_moe->gate->forward(x.reshape({-1, h}));
  EXPECT_TRUE(r.kept.all().item<bool>());
  EXPECT_EQ(out.exp_counts[0].item<int64_t>(), 10);
  auto& experts = layer->deepspeed_moe->experts->as<moe::ExpertsImpl>()->experts;
  at::Tensor ref = per_token(r, x.reshape({-1, h}),
                             [&](int64_t e, const at::Tensor& t) { return experts[e].forward(t); });
  EXPECT_LT(rel(out.output.reshape({-1, h}), ref), 1e-6);
}

// GELU's tanh approximation as PyTorch documents gelu(approximate="tanh"):
// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), written out here.
at::Tensor gelu_tanh_formula(const at::Tensor& x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + at::tanh(c * (x + 0.044715 * x * x * x)));
}

TEST(MoeLayer, GroupedMlpEqualsEachExpertsProducts) {
  at::manual_seed(11);
  for (auto act : {moe::Activation::kGelu, moe::Activation::kGeluTanh, moe::Activation::kSwiglu}) {
    moe::GroupedMLP g(moe::GroupedMLPOptions(4, 6, 5).activation(act));
    at::Tensor counts = at::tensor(std::vector<int64_t>{2, 0, 3, 1});
    at::Tensor rows = at::randn({6, 6}, at::kDouble);
    g->to(at::kDouble);
    at::Tensor out = g->run_experts(rows, counts);
    std::vector<int64_t> expert_of = {0, 0, 2, 2, 2, 3};
    for (int64_t i = 0; i < 6; ++i) {
      int64_t e = expert_of[i];
      at::Tensor hid = at::mm(rows.narrow(0, i, 1), g->weight1[e]);
      if (act == moe::Activation::kSwiglu) {
        auto c = hid.chunk(2, -1);
        hid = at::silu(c[0]) * c[1];
      } else if (act == moe::Activation::kGeluTanh) {
        // At these inputs (|x| ~ 0.5) the two GELUs differ by far more than 1e-12: the exact
        // one would fail this comparison.
        hid = gelu_tanh_formula(hid);
      } else {
        hid = at::gelu(hid);
      }
      EXPECT_LT(rel(out.narrow(0, i, 1), at::mm(hid, g->weight2[e])), 1e-12);
    }
  }
}

// fp32 at aligned widths: ATen's grouped product (ops::grouped_mm), equal to the loop of
// per-expert products in forward and in every gradient within 1e-6.
TEST(MoeLayer, GroupedMlpThroughAtenGroupedMmEqualsTheLoop) {
  at::manual_seed(13);
  for (auto act : {moe::Activation::kGelu, moe::Activation::kGeluTanh, moe::Activation::kSwiglu}) {
    moe::GroupedMLP g(moe::GroupedMLPOptions(4, 8, 16).activation(act));
    ASSERT_TRUE(dscpp::ops::grouped_mm_uses_aten(at::zeros({1, 8}), g->weight1));
    std::vector<int64_t> n = {5, 0, 7, 3};
    at::Tensor rows = at::randn({15, 8}).requires_grad_(true);
    at::Tensor out = g->run_experts(rows, at::tensor(n));
    at::Tensor w1 = g->weight1.detach().clone().requires_grad_(true);
    at::Tensor w2 = g->weight2.detach().clone().requires_grad_(true);
    at::Tensor r2 = rows.detach().clone().requires_grad_(true);
    std::vector<at::Tensor> parts;
    int64_t o = 0;
    for (int64_t e = 0; e < 4; ++e) {
      at::Tensor hid = moe::apply_activation(at::mm(r2.narrow(0, o, n[e]), w1[e]), act);
      parts.push_back(at::mm(hid, w2[e]));
      o += n[e];
    }
    at::Tensor ref = at::cat(parts, 0);
    EXPECT_LT(rel(out, ref), 1e-6);
    at::Tensor grad = at::randn_like(ref);
    (out * grad).sum().backward();
    (ref * grad).sum().backward();
    EXPECT_LT(rel(rows.grad(), r2.grad()), 1e-6);
    EXPECT_LT(rel(g->weight1.grad(), w1.grad()), 1e-6);
    EXPECT_LT(rel(g->weight2.grad(), w2.grad()), 1e-6);
  }
}

TEST(MoeLayer, LatentWithSharedExpert) {
  at::manual_seed(12);
  const int64_t h = 16, latent = 8;
  moe::ExpertMLP shared(moe::ExpertMLPOptions(h, 12));
  moe::MoE layer(moe::MoEOptions(h)
                     .num_experts(4)
                     .k(2)
                     .top2_2nd_expert_sampling(false)
                     .capacity_factor(0)
                     .ffn_hidden_size(10)
                     .activation(moe::Activation::kSwiglu)
                     .latent_size(latent)
                     .shared_expert(AnyModule(shared)));
  at::Tensor x = at::randn({3, 4, h});
  auto out = layer->forward(x);
  at::Tensor tokens = x.reshape({-1, h});
  moe::Routing r = layer->deepspeed_moe->gate->forward(tokens);
  auto* g = layer->deepspeed_moe->experts->as<moe::GroupedMLPImpl>();
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->weight1.sizes(), (std::vector<int64_t>{4, latent, 20}));
  at::Tensor z = at::mm(tokens, layer->latent_down->weight.t());
  at::Tensor routed = per_token(r, z, [&](int64_t e, const at::Tensor& t) {
    auto c = at::mm(t, g->weight1[e]).chunk(2, -1);
    return at::mm(at::silu(c[0]) * c[1], g->weight2[e]);
  });
  at::Tensor ref = at::mm(routed, layer->latent_up->weight.t()) + shared->forward(tokens);
  EXPECT_LT(rel(out.output.reshape({-1, h}), ref), 1e-6);
  // The gradient reaches every part.
  out.output.sum().backward();
  for (auto& item : layer->named_parameters())
    EXPECT_TRUE(item.value().grad().defined() && item.value().grad().abs().sum().item<double>() > 0)
        << item.key();
}

TEST(MoeLayer, RouterLossesGoToTheAuxLossChannel) {
  at::manual_seed(13);
  moe::MoE layer(moe::MoEOptions(8)
                     .num_experts(4)
                     .k(2)
                     .top2_2nd_expert_sampling(false)
                     .capacity_factor(0)
                     .ffn_hidden_size(8)
                     .z_loss_coeff(1e-3)
                     .seq_aux_loss_coeff(1e-2));
  at::Tensor x = at::randn({2, 3, 8});
  EXPECT_THROW(layer->forward(x), dscpp::Error);  // outside an AuxLossScope
  dscpp::nn::AuxLossScope scope;
  layer->forward(x);
  moe::Routing r = layer->deepspeed_moe->gate->forward(x.reshape({-1, 8}), 3);
  ASSERT_TRUE(scope.sum().defined());
  EXPECT_NEAR(scope.sum().item<double>(), (r.z_loss + r.seq_aux_loss).item<double>(), 1e-7);
}

TEST(MoeLayer, DeepSpeedNamesAndIndependentClones) {
  moe::ExpertMLP expert(moe::ExpertMLPOptions(8, 16));
  moe::MoE layer(moe::MoEOptions(8).expert(AnyModule(expert)).num_experts(3).use_residual(true));
  auto params = layer->named_parameters();
  for (const char* name :
       {"deepspeed_moe.gate.wg.weight", "deepspeed_moe.experts.deepspeed_experts.0.fc1.weight",
        "deepspeed_moe.experts.deepspeed_experts.2.fc2.bias", "mlp.fc1.weight",
        "coefficient.weight", "coefficient.bias"})
    EXPECT_TRUE(params.contains(name)) << name;
  EXPECT_EQ(params.size(), 1u + 3 * 4 + 4 + 2);
  // DeepSpeed deep-copies: the clones start equal to the expert and then are their own.
  at::Tensor w0 = params["deepspeed_moe.experts.deepspeed_experts.0.fc1.weight"];
  at::Tensor w1 = params["deepspeed_moe.experts.deepspeed_experts.1.fc1.weight"];
  EXPECT_TRUE(at::equal(w0, expert->fc1->weight));
  at::NoGradGuard g;
  w0.add_(1.0);
  EXPECT_FALSE(at::equal(w0, w1));
  EXPECT_TRUE(at::equal(w1, expert->fc1->weight));
  EXPECT_TRUE(params["mlp.fc1.weight"].is_same(expert->fc1->weight));
}

TEST(MoeLayer, Refusals) {
  auto refuses = [](const moe::MoEOptions& o, const std::string& what) {
    try {
      moe::MoE layer(o);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const dscpp::Error& err) {
      EXPECT_NE(std::string(err.what()).find(what), std::string::npos) << err.what();
    }
  };
  auto base = moe::MoEOptions(8).num_experts(4).ffn_hidden_size(8);
  refuses(moe::MoEOptions(base).ep_size(2), "ep_size = 2 needs ep_group");
  refuses(moe::MoEOptions(base).ep_size(3), "divisible by ep_size");
  refuses(moe::MoEOptions(base).ffn_hidden_size(0), "ffn_hidden_size");
  refuses(moe::MoEOptions(base).use_residual(true), "use_residual");
  refuses(moe::MoEOptions(base).k(5), "k must be in");
}
