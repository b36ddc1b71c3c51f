// nn::moe's router against hand-computed values: the capacity rule, top-2's drop order,
// sigmoid top-8, z-loss, the sequence-wise aux loss, device-limited routing, bias-based
// balancing (selection only; balance reached in a stated number of steps), fp32 logits and
// the refusals. (DeepSpeed's own TopKGate is the oracle of moe_deepspeed_oracle.py.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <set>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/nn/moe/router.h"

namespace moe = dscpp::nn::moe;

namespace {

// A gate whose logits are its input: model_dim = num_experts, wg = I.
moe::TopKGate identity_gate(moe::TopKGateOptions o) {
  moe::TopKGate gate(o);
  at::NoGradGuard g;
  gate->wg->weight.copy_(at::eye(o.num_experts()));
  return gate;
}

double sigmoid(double v) {
  return 1.0 / (1.0 + std::exp(-v));
}

std::vector<double> row(const at::Tensor& t, int64_t s) {
  at::Tensor r = t[s].to(at::kDouble).contiguous();
  return std::vector<double>(r.data_ptr<double>(), r.data_ptr<double>() + r.numel());
}

}  // namespace

TEST(MoeRouter, CapacityRuleAsDeepSpeed) {
  at::manual_seed(0);
  at::Tensor x = at::randn({10, 4});
  auto cap = [&](moe::TopKGateOptions o, bool train = true) {
    auto gate = identity_gate(o.use_rts(false).top2_2nd_expert_sampling(false));
    gate->train(train);
    return gate->forward(x).capacity;
  };
  // ceil(10 / 4 * factor * k), at least min_capacity
  EXPECT_EQ(cap(moe::TopKGateOptions(4, 4).k(1).min_capacity(0)), 3);
  EXPECT_EQ(cap(moe::TopKGateOptions(4, 4).k(1).min_capacity(4)), 4);
  EXPECT_EQ(cap(moe::TopKGateOptions(4, 4).k(2).min_capacity(0)), 5);
  EXPECT_EQ(cap(moe::TopKGateOptions(4, 4).k(3).capacity_factor(0.5).min_capacity(0)), 4);
  EXPECT_EQ(cap(moe::TopKGateOptions(4, 4).k(2).eval_capacity_factor(2.0).min_capacity(0), false),
            10);
  // dropless: no capacity, every route kept
  auto gate = identity_gate(moe::TopKGateOptions(4, 4).k(2).capacity_factor(0));
  moe::Routing r = gate->forward(x);
  EXPECT_EQ(r.capacity, -1);
  EXPECT_TRUE(r.kept.all().item<bool>());
  gate = identity_gate(moe::TopKGateOptions(4, 4).k(2).drop_tokens(false));
  EXPECT_TRUE(gate->forward(x).kept.all().item<bool>());
}

TEST(MoeRouter, Top2KeepsFirstChoicesBeforeSecond) {
  // Every token prefers expert 0, then 1; capacity ceil(6 / 4 * 2) = 3: tokens 0-2 keep both
  // routes, tokens 3-5 lose both (their weights 0); kept weights are normalised over the two.
  at::Tensor x = at::tensor({3.0f, 2.0f, 0.0f, -1.0f}).repeat({6, 1}) +
                 at::arange(6, at::kFloat).unsqueeze(1) * 0.01f;
  auto gate = identity_gate(
      moe::TopKGateOptions(4, 4).k(2).min_capacity(0).top2_2nd_expert_sampling(false));
  moe::Routing r = gate->forward(x);
  ASSERT_EQ(r.capacity, 3);
  for (int64_t s = 0; s < 6; ++s) {
    EXPECT_EQ(r.indices[s][0].item<int64_t>(), 0);
    EXPECT_EQ(r.indices[s][1].item<int64_t>(), 1);
    const bool keep = s < 3;
    EXPECT_EQ(r.kept[s][0].item<bool>(), keep);
    EXPECT_EQ(r.kept[s][1].item<bool>(), keep);
    std::vector<double> l = row(x, s);
    double z = 0;
    for (double v : l) z += std::exp(v);
    double p0 = std::exp(l[0]) / z, p1 = std::exp(l[1]) / z;
    EXPECT_NEAR(r.weights[s][0].item<float>(), keep ? p0 / (p0 + p1) : 0.0, 1e-6);
    EXPECT_NEAR(r.weights[s][1].item<float>(), keep ? p1 / (p0 + p1) : 0.0, 1e-6);
  }
  EXPECT_EQ(r.exp_counts[0].item<int64_t>(), 6);  // counted before dropping
  EXPECT_EQ(r.exp_counts[1].item<int64_t>(), 6);
}

TEST(MoeRouter, SigmoidTop8NormalisedOverTheChosen) {
  at::manual_seed(1);
  const int64_t e = 16, k = 8, s = 5;
  at::Tensor x = at::randn({s, e});
  auto gate = identity_gate(moe::TopKGateOptions(e, e)
                                .k(k)
                                .capacity_factor(0)
                                .score_function(moe::ScoreFunction::kSigmoid)
                                .topk_scaling_factor(2.5));
  moe::Routing r = gate->forward(x);
  for (int64_t t = 0; t < s; ++t) {
    std::vector<double> l = row(x, t);
    std::vector<int64_t> order(e);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return l[a] > l[b]; });
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += sigmoid(l[order[j]]);
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_EQ(r.indices[t][j].item<int64_t>(), order[j]);
      EXPECT_NEAR(r.weights[t][j].item<float>(), 2.5 * sigmoid(l[order[j]]) / sum, 1e-6);
    }
  }
}

TEST(MoeRouter, ZLossAndSequenceAuxLoss) {
  at::manual_seed(2);
  const int64_t b = 2, t = 3, e = 4, k = 2;
  at::Tensor x = at::randn({b * t, e});
  auto gate = identity_gate(moe::TopKGateOptions(e, e)
                                .k(k)
                                .capacity_factor(0)
                                .top2_2nd_expert_sampling(false)
                                .z_loss_coeff(0.1)
                                .seq_aux_loss_coeff(0.01));
  moe::Routing r = gate->forward(x, t);
  double z = 0;
  std::vector<std::vector<double>> p(b * t, std::vector<double>(e));
  for (int64_t s = 0; s < b * t; ++s) {
    std::vector<double> l = row(x, s);
    double sum = 0;
    for (double v : l) sum += std::exp(v);
    z += std::log(sum) * std::log(sum);
    for (int64_t i = 0; i < e; ++i) p[s][i] = std::exp(l[i]) / sum;
  }
  EXPECT_NEAR(r.z_loss.item<double>(), 0.1 * z / (b * t), 1e-6);
  // DeepSeek-V3: per sequence Σ_i f_i P_i, f_i = E / (k T) · count_i, P_i = mean_t p_ti
  double seq = 0;
  for (int64_t q = 0; q < b; ++q) {
    for (int64_t i = 0; i < e; ++i) {
      double count = 0, mean_p = 0;
      for (int64_t s = q * t; s < (q + 1) * t; ++s) {
        for (int64_t j = 0; j < k; ++j) count += r.indices[s][j].item<int64_t>() == i;
        mean_p += p[s][i] / t;
      }
      seq += static_cast<double>(e) / (k * t) * count * mean_p;
    }
  }
  EXPECT_NEAR(r.seq_aux_loss.item<double>(), 0.01 * seq / b, 1e-7);
  EXPECT_THROW(gate->forward(x), dscpp::Error);  // no sequence length
}

TEST(MoeRouter, DeviceLimitedRouting) {
  // 8 experts in 4 groups of 2, k = 4 from at most 2 groups; a group scores the sum of its best
  // k / 2 = 2 sigmoid scores. Unlimited, token 0 would take experts {0, 4, 2, 3} (3 groups).
  std::vector<float> l0 = {5, -5, 4, 4, 4.5f, -5, 3.9f, 3.9f};
  at::Tensor x = at::tensor(l0).unsqueeze(0);
  auto options = moe::TopKGateOptions(8, 8).k(4).capacity_factor(0).score_function(
      moe::ScoreFunction::kSigmoid);
  std::set<int64_t> unlimited;
  for (int64_t j = 0; j < 4; ++j)
    unlimited.insert(identity_gate(options)->forward(x).indices[0][j].item<int64_t>());
  EXPECT_EQ(unlimited, (std::set<int64_t>{0, 2, 3, 4}));
  std::vector<std::pair<double, int64_t>> groups;
  for (int64_t g = 0; g < 4; ++g)
    groups.push_back({sigmoid(l0[2 * g]) + sigmoid(l0[2 * g + 1]), g});
  std::sort(groups.rbegin(), groups.rend());
  std::set<int64_t> allowed;
  for (int64_t j = 0; j < 2; ++j) {
    allowed.insert(2 * groups[j].second);
    allowed.insert(2 * groups[j].second + 1);
  }
  moe::Routing r = identity_gate(options.num_groups(4).group_topk(2))->forward(x);
  std::set<int64_t> chosen;
  for (int64_t j = 0; j < 4; ++j) chosen.insert(r.indices[0][j].item<int64_t>());
  EXPECT_EQ(chosen, allowed);
  EXPECT_EQ(chosen, (std::set<int64_t>{2, 3, 6, 7}));
}

TEST(MoeRouter, ExpertBiasSelectsButDoesNotWeigh) {
  at::manual_seed(3);
  auto gate = identity_gate(moe::TopKGateOptions(4, 4)
                                .k(2)
                                .top2_2nd_expert_sampling(false)
                                .capacity_factor(0)
                                .score_function(moe::ScoreFunction::kSigmoid)
                                .enable_expert_bias(true));
  // A buffer in the state dict, not a parameter.
  EXPECT_EQ(gate->named_buffers().size(), 1u);
  EXPECT_TRUE(gate->named_buffers().contains("expert_bias"));
  EXPECT_EQ(gate->named_parameters().size(), 1u);
  gate->expert_bias.fill_(0).index_put_({3}, 10.0f);
  at::Tensor x = at::randn({6, 4});
  moe::Routing r = gate->forward(x);
  for (int64_t s = 0; s < 6; ++s) {
    EXPECT_EQ(r.indices[s][0].item<int64_t>(), 3);
    std::vector<double> l = row(x, s);
    int64_t other = r.indices[s][1].item<int64_t>();
    double sum = sigmoid(l[3]) + sigmoid(l[other]);
    EXPECT_NEAR(r.weights[s][0].item<float>(), sigmoid(l[3]) / sum, 1e-6);
  }
}

TEST(MoeRouter, BiasBalancingWithoutAuxLoss) {
  // Skewed synthetic tokens: a per-expert offset on the logits makes the busiest expert take
  // several times its share. The bias alone (rate 0.01, 8 experts, top-2, 512 fresh tokens a
  // step) brings max / mean tokens per expert from 3.3 to within 10% of 1 in 27 steps (at most
  // 30 asserted).
  at::manual_seed(4);
  const int64_t e = 8, s = 512;
  auto gate = identity_gate(moe::TopKGateOptions(e, e)
                                .k(2)
                                .top2_2nd_expert_sampling(false)
                                .capacity_factor(0)
                                .score_function(moe::ScoreFunction::kSigmoid)
                                .enable_expert_bias(true)
                                .bias_update_rate(0.01));
  at::Tensor skew = at::linspace(1.0, -1.0, e);
  auto balance = [](const at::Tensor& counts) {
    at::Tensor c = counts.to(at::kDouble);
    return (c.max() / c.mean()).item<double>();
  };
  const double start = balance(gate->forward(at::randn({s, e}) * 0.5 + skew).exp_counts);
  EXPECT_GT(start, 2.0);
  gate->update_expert_bias();
  int64_t reached = -1;
  for (int64_t step = 1; step <= 200 && reached < 0; ++step) {
    moe::Routing r = gate->forward(at::randn({s, e}) * 0.5 + skew);
    if (balance(r.exp_counts) <= 1.1) reached = step;
    gate->update_expert_bias();
  }
  std::cout << "bias balancing: max/mean " << start << " at start, within 1.1 after " << reached
            << " steps\n";
  EXPECT_GT(reached, 0);
  EXPECT_LE(reached, 30);
}

TEST(MoeRouter, LogitsInFp32ForBf16Input) {
  auto gate = identity_gate(moe::TopKGateOptions(4, 4).k(2).capacity_factor(0));
  gate->to(at::kBFloat16);
  moe::Routing r = gate->forward(at::randn({5, 4}).to(at::kBFloat16));
  EXPECT_EQ(r.logits.scalar_type(), at::kFloat);
  EXPECT_EQ(r.weights.scalar_type(), at::kFloat);
}

TEST(MoeRouter, ExpertBiasStaysFp32WhenTheModelIsCastToBf16) {
  // The engine casts the whole module (its parent's Module::to reaches the gate); Megatron
  // keeps the bias fp32 (_maintain_float32_expert_bias). 0.3001 has no bf16 value (bf16's step
  // near 0.3 is 2^-9 = 0.00195, twice the update rate): a 16-bit bias would read 0.30078 and
  // not move by 1e-3.
  struct Holder : torch::nn::Module {
    moe::TopKGate gate{nullptr};
  };
  auto holder = std::make_shared<Holder>();
  holder->gate = holder->register_module(
      "gate", identity_gate(moe::TopKGateOptions(4, 4)
                                .k(1)
                                .capacity_factor(0)
                                .score_function(moe::ScoreFunction::kSigmoid)
                                .enable_expert_bias(true)
                                .bias_update_rate(1e-3)));
  holder->gate->expert_bias.fill_(0.3001f);
  holder->to(at::kCPU, at::kBFloat16);
  EXPECT_EQ(holder->gate->wg->weight.scalar_type(), at::kBFloat16);
  const at::Tensor& bias = holder->gate->expert_bias;
  ASSERT_EQ(bias.scalar_type(), at::kFloat);
  // Still the registered buffer (the state dict's tensor), with its value.
  EXPECT_TRUE(holder->named_buffers()["gate.expert_bias"].is_same(bias));
  EXPECT_EQ(bias[0].item<float>(), 0.3001f);
  holder->to(at::kHalf);  // the dtype-only overload too
  ASSERT_EQ(bias.scalar_type(), at::kFloat);
  // Every token to expert 0 (input column 0 large): expert 0 loses 1e-3, the others gain it.
  at::Tensor x = at::zeros({8, 4}, at::kHalf);
  x.select(1, 0).fill_(5.0);
  holder->gate->forward(x);
  holder->gate->update_expert_bias();
  ASSERT_EQ(bias.scalar_type(), at::kFloat);
  EXPECT_FLOAT_EQ(bias[0].item<float>(), 0.3001f - 1e-3f);
  for (int64_t j = 1; j < 4; ++j) EXPECT_FLOAT_EQ(bias[j].item<float>(), 0.3001f + 1e-3f);
}

TEST(MoeRouter, RefusesBadOptions) {
  auto refuses = [](moe::TopKGateOptions o, const std::string& what) {
    try {
      moe::TopKGate gate(o);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const dscpp::Error& err) {
      EXPECT_NE(std::string(err.what()).find(what), std::string::npos) << err.what();
    }
  };
  refuses(moe::TopKGateOptions(4, 4).k(5), "k must be in");
  refuses(moe::TopKGateOptions(4, 4).noisy_gate_policy("Gumbel"), "noisy_gate_policy");
  refuses(moe::TopKGateOptions(4, 4).k(2).noisy_gate_policy("RSample"), "RSample");
  refuses(moe::TopKGateOptions(4, 4).num_groups(3).group_topk(1), "num_groups");
  refuses(moe::TopKGateOptions(4, 4).num_groups(2).group_topk(3), "group_topk");
  refuses(moe::TopKGateOptions(4, 4).capacity_factor(-1), "capacity_factor");
}

TEST(MoeRouter, NoiseOnlyWhereAsked) {
  at::manual_seed(5);
  at::Tensor x = at::randn({16, 4});
  // use_rts: an expert over capacity keeps exactly C of its tokens, a random C.
  at::Tensor skewed = x.clone();
  skewed.select(1, 0).add_(10.0);  // every token's first choice: expert 0
  auto rts = identity_gate(moe::TopKGateOptions(4, 4).k(1).min_capacity(0).use_rts(true));
  moe::Routing a = rts->forward(skewed), b = rts->forward(skewed);
  EXPECT_EQ(a.capacity, 4);
  EXPECT_EQ(a.kept.sum().item<int64_t>(), 4);
  EXPECT_EQ(b.kept.sum().item<int64_t>(), 4);
  bool differs = false;
  for (int i = 0; i < 8 && !differs; ++i) differs = !at::equal(rts->forward(skewed).kept, a.kept);
  EXPECT_TRUE(differs);
  // Jitter scales the input by U(0.99, 1.01) in training only; RSample noises the choice in
  // training only.
  auto jitter = identity_gate(moe::TopKGateOptions(4, 4).noisy_gate_policy("Jitter"));
  at::Tensor l = jitter->forward(x).logits;
  EXPECT_FALSE(at::equal(l, x));
  EXPECT_TRUE(((l - x).abs() <= x.abs() * 0.01 + 1e-7).all().item<bool>());
  jitter->eval();
  EXPECT_TRUE(at::equal(jitter->forward(x).logits, x));
  auto rsample = identity_gate(
      moe::TopKGateOptions(4, 4).noisy_gate_policy("RSample").capacity_factor(0).use_rts(false));
  at::Tensor argmax = x.argmax(1, true);
  bool noisy = false;
  for (int i = 0; i < 8 && !noisy; ++i) noisy = !at::equal(rsample->forward(x).indices, argmax);
  EXPECT_TRUE(noisy);
  rsample->eval();
  EXPECT_TRUE(at::equal(rsample->forward(x).indices, argmax));
  // top-2 sampling: the second choice is random, never the first.
  auto sampled = identity_gate(moe::TopKGateOptions(4, 4).k(2).capacity_factor(0));
  moe::Routing r = sampled->forward(x);
  EXPECT_TRUE(r.indices.select(1, 0).ne(r.indices.select(1, 1)).all().item<bool>());
  EXPECT_TRUE(at::equal(r.indices.select(1, 0), x.argmax(1)));
}
