// Optimizers on 2-element shards against updates worked out by hand (in double), and the
// config handling: names, defaults, DeepSpeed-only params, errors with their JSON path.
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "dscpp/config/config_error.h"
#include "dscpp/error.h"
#include "dscpp/optim/optimizer.h"

namespace {

using dscpp::ConfigError;
using dscpp::optim::make_optimizer;
using dscpp::optim::Optimizer;
using nlohmann::json;

std::unique_ptr<Optimizer> make(const std::string& type, json params = json::object()) {
  dscpp::OptimizerConfig c;
  c.type = type;
  c.params = std::move(params);
  return make_optimizer(c);
}

at::Tensor vec(const std::vector<float>& v) {
  at::Tensor t = at::empty({static_cast<int64_t>(v.size())}, at::kFloat);
  std::copy(v.begin(), v.end(), t.data_ptr<float>());
  return t;
}

std::vector<double> values(const at::Tensor& t) {
  const float* d = t.data_ptr<float>();
  return {d, d + t.numel()};
}

void expect_near(const at::Tensor& got, const std::vector<double>& want, double tol = 1e-6) {
  auto g = values(got);
  ASSERT_EQ(g.size(), want.size());
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(g[i], want[i], tol) << "element " << i;
}

// The path a ConfigError names for building this optimizer (empty: no error).
std::string optimizer_error_path(const std::string& type, const json& params) {
  try {
    make(type, params);
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(e.path(), 0), 0u) << "path leads the message";
    return e.path();
  }
  return "";
}

// ZeRO's 16-bit gradient partition: a bf16 or fp16 gradient is widened (exactly) before the
// update, so each optimizer steps as it does from the same values in fp32; other types are
// refused.
TEST(Optimizer, SixteenBitGradientsStepAsTheirFp32Values) {
  for (const std::string type : {"AdamW", "SGD", "Lamb", "Lion", "Adagrad"})
    for (const auto dtype : {at::kBFloat16, at::kHalf}) {
      SCOPED_TRACE(type + " " + std::string(c10::toString(dtype)));
      auto wide = make(type, {{"lr", 0.1}}), narrow = make(type, {{"lr", 0.1}});
      wide->add_shard(vec({0.5f, -1.25f, 2.0f}));
      narrow->add_shard(vec({0.5f, -1.25f, 2.0f}));
      const at::Tensor g16 = vec({0.375f, -3.0f, 0.0078125f}).to(dtype);
      for (int step = 0; step < 2; ++step) {
        wide->step({g16.to(at::kFloat)});
        narrow->step({g16});
      }
      EXPECT_TRUE(narrow->shard(0).equal(wide->shard(0)));
      EXPECT_FALSE(narrow->shard(0).equal(vec({0.5f, -1.25f, 2.0f}))) << "no update at all";
      if (!narrow->elementwise()) continue;
      narrow->begin_step();
      wide->begin_step();
      narrow->update_range(0, 1, 3, g16.slice(0, 1, 3));
      wide->update_range(0, 1, 3, g16.slice(0, 1, 3).to(at::kFloat));
      EXPECT_TRUE(narrow->shard(0).equal(wide->shard(0)));
    }
  auto adam = make("AdamW");
  adam->add_shard(vec({1.0f, 2.0f}));
  EXPECT_THROW(adam->step({vec({1.0f, 2.0f}).to(at::kDouble)}), dscpp::Error);
}

// First step: m_hat = g and v_hat = g^2, so Adam moves each element by lr * g / (|g| + eps).
TEST(Adam, FirstStepOfAdamWIsSignStepPlusDecoupledDecay) {
  auto opt = make("AdamW", {{"lr", 0.1}, {"weight_decay", 0.1}});
  EXPECT_EQ(opt->name(), "adamw");
  opt->add_shard(vec({1.0f, -2.0f}));
  opt->step({vec({0.5f, 0.25f})});
  expect_near(opt->shard(0), {1.0 * (1 - 0.01) - 0.1 * 0.5 / (0.5 + 1e-8),
                              -2.0 * (1 - 0.01) - 0.1 * 0.25 / (0.25 + 1e-8)});
}

TEST(Adam, SecondStepUsesBiasCorrectedMoments) {
  auto opt = make("adamw", {{"lr", 0.1}, {"betas", {0.9, 0.999}}});
  opt->add_shard(vec({1.0f, -2.0f}));
  opt->step({vec({0.5f, 0.25f})});
  opt->step({vec({-0.5f, 0.1f})});
  std::vector<double> want;
  const double p1[] = {1.0 - 0.1, -2.0 - 0.1}, g1[] = {0.5, 0.25}, g2[] = {-0.5, 0.1};
  for (int i = 0; i < 2; ++i) {
    double m = 0.9 * 0.1 * g1[i] + 0.1 * g2[i];
    double v = 0.999 * 0.001 * g1[i] * g1[i] + 0.001 * g2[i] * g2[i];
    double m_hat = m / (1 - 0.9 * 0.9), v_hat = v / (1 - 0.999 * 0.999);
    want.push_back(p1[i] - 0.1 * m_hat / (std::sqrt(v_hat) + 1e-8));
  }
  expect_near(opt->shard(0), want);
  EXPECT_EQ(opt->step_count(0), 2);
}

TEST(Adam, AdamWModeFalseMakesWeightDecayAnL2Term) {
  auto opt = make("adam", {{"lr", 0.1}, {"weight_decay", 0.1}, {"adam_w_mode", false}});
  opt->add_shard(vec({1.0f, -2.0f}));
  opt->step({vec({0.5f, 0.25f})});
  const double g0 = 0.5 + 0.1 * 1.0, g1 = 0.25 - 0.1 * 2.0;  // grad + wd * p
  expect_near(opt->shard(0),
              {1.0 - 0.1 * g0 / (std::abs(g0) + 1e-8), -2.0 - 0.1 * g1 / (std::abs(g1) + 1e-8)});
}

TEST(Adam, NameAdamDecaysDecoupledByDefaultAsDeepSpeed) {
  auto adam = make("Adam", {{"lr", 0.1}, {"weight_decay", 0.1}});
  auto adamw = make("adamw", {{"lr", 0.1}, {"weight_decay", 0.1}, {"adam_w_mode", false}});
  for (auto* o : {adam.get(), adamw.get()}) {
    o->add_shard(vec({1.0f, -2.0f}));
    o->step({vec({0.5f, 0.25f})});
  }
  EXPECT_EQ(values(adam->shard(0)), values(adamw->shard(0)));
}

TEST(Adam, WithoutBiasCorrectionTheStepIsLrTimesMOverSqrtV) {
  auto opt = make("adam", {{"lr", 0.1}, {"bias_correction", false}});
  opt->add_shard(vec({1.0f, -2.0f}));
  opt->step({vec({0.5f, 0.25f})});
  const double g[] = {0.5, 0.25};
  std::vector<double> want = {1.0, -2.0};
  for (int i = 0; i < 2; ++i) want[i] -= 0.1 * 0.1 * g[i] / (std::sqrt(0.001) * g[i] + 1e-8);
  expect_near(opt->shard(0), want);
}

TEST(SGD, MomentumWithDampeningAndWeightDecayAsTorch) {
  auto opt =
      make("SGD", {{"lr", 0.1}, {"momentum", 0.9}, {"dampening", 0.5}, {"weight_decay", 0.1}});
  EXPECT_EQ(opt->name(), "SGD");
  opt->add_shard(vec({1.0f, -2.0f}));
  opt->step({vec({0.5f, 0.25f})});
  opt->step({vec({-0.5f, 0.1f})});
  const double p0[] = {1.0, -2.0}, g1[] = {0.5, 0.25}, g2[] = {-0.5, 0.1};
  std::vector<double> want;
  for (int i = 0; i < 2; ++i) {
    double d1 = g1[i] + 0.1 * p0[i];
    double buf = d1;  // the first step copies the gradient, undamped
    double p1 = p0[i] - 0.1 * buf;
    double d2 = g2[i] + 0.1 * p1;
    buf = 0.9 * buf + 0.5 * d2;
    want.push_back(p1 - 0.1 * buf);
  }
  expect_near(opt->shard(0), want);
}

TEST(SGD, NesterovLooksAhead) {
  auto opt = make("sgd", {{"lr", 0.1}, {"momentum", 0.9}, {"nesterov", true}});
  opt->add_shard(vec({1.0f, -2.0f}));
  opt->step({vec({0.5f, 0.25f})});
  expect_near(opt->shard(0), {1.0 - 0.1 * (0.5 + 0.9 * 0.5), -2.0 - 0.1 * (0.25 + 0.9 * 0.25)});
}

TEST(SGD, PlainStepAndNoState) {
  auto opt = make("SGD", {{"lr", 0.5}});
  opt->add_shard(vec({1.0f, -2.0f}));
  opt->step({vec({0.5f, 0.25f})});
  expect_near(opt->shard(0), {0.75, -2.125});
  EXPECT_EQ(opt->state_numel(), 0);
}

TEST(Adagrad, FirstStepDividesByTheGradientsMagnitude) {
  auto opt = make("Adagrad", {{"lr", 0.1}});
  opt->add_shard(vec({1.0f, -2.0f}));
  opt->step({vec({0.5f, -0.25f})});
  expect_near(opt->shard(0), {1.0 - 0.1 * 0.5 / (0.5 + 1e-10), -2.0 + 0.1 * 0.25 / (0.25 + 1e-10)});
  expect_near(opt->state(0).at("sum"), {0.25, 0.0625});
}

TEST(Lion, StepIsTheSignOfTheInterpolationPlusDecoupledDecay) {
  auto opt = make("lion", {{"lr", 0.1}, {"weight_decay", 0.1}});
  opt->add_shard(vec({1.0f, -2.0f}));
  opt->step({vec({0.5f, -0.25f})});
  expect_near(opt->shard(0), {1.0 * 0.99 - 0.1, -2.0 * 0.99 + 0.1});
  // m = b2*m + (1-b2)*g with DeepSpeed's default b2 = 0.999
  expect_near(opt->state(0).at("exp_avg"), {0.001 * 0.5, -0.001 * 0.25}, 1e-9);
}

TEST(Lamb, FirstStepScalesByTheClampedTrustRatio) {
  auto opt = make("lamb", {{"lr", 0.01}, {"weight_decay", 0.1}});
  opt->add_shard(vec({3.0f, 4.0f}));
  opt->step({vec({0.3f, -0.4f})});
  const double p[] = {3.0, 4.0}, g[] = {0.3, -0.4};
  double u[2], u_norm = 0;
  for (int i = 0; i < 2; ++i) {
    u[i] = 0.1 * g[i] / (std::sqrt(0.001) * std::abs(g[i]) + 1e-8) + 0.1 * p[i];
    u_norm += u[i] * u[i];
  }
  const double ratio = std::min(10.0, std::max(0.01, 5.0 / std::sqrt(u_norm)));
  const double step_size = 0.01 * std::sqrt(0.001) / 0.1;
  expect_near(opt->shard(0), {3.0 - step_size * ratio * u[0], 4.0 - step_size * ratio * u[1]});
}

TEST(Lamb, SegmentsGiveEachRunItsOwnTrustRatio) {
  auto whole = make("lamb", {{"lr", 0.01}});
  whole->add_shard(vec({3.0f, 4.0f, 0.01f, -0.02f}), {{"segments", {2, 2}}});
  auto split = make("lamb", {{"lr", 0.01}});
  split->add_shard(vec({3.0f, 4.0f}));
  split->add_shard(vec({0.01f, -0.02f}));
  for (int t = 0; t < 3; ++t) {
    whole->step({vec({0.3f, -0.4f, 0.5f, 0.1f})});
    split->step({vec({0.3f, -0.4f}), vec({0.5f, 0.1f})});
  }
  auto w = values(whole->shard(0)), a = values(split->shard(0)), b = values(split->shard(1));
  a.insert(a.end(), b.begin(), b.end());
  EXPECT_EQ(w, a);
  // One ratio over all four differs: the small tensor's ratio is clamped at min_coeff alone.
  auto one = make("lamb", {{"lr", 0.01}});
  one->add_shard(vec({3.0f, 4.0f, 0.01f, -0.02f}));
  one->step({vec({0.3f, -0.4f, 0.5f, 0.1f})});
  EXPECT_NE(values(one->shard(0)), std::vector<double>(a.begin(), a.end()));
}

TEST(Lamb, SegmentsMustCoverTheShard) {
  auto opt = make("lamb");
  try {
    opt->add_shard(vec({1.0f, 2.0f, 3.0f}), {{"segments", {1, 1}}});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.path(), "optimizer.params.segments");
  }
}

TEST(Optimizer, StateIsTwiceTheShardForAdamAndPyTorchNamed) {
  auto opt = make("adamw");
  opt->add_shard(vec(std::vector<float>(5, 1.0f)));
  opt->add_shard(vec(std::vector<float>(3, 1.0f)));
  EXPECT_EQ(opt->state_numel(), 2 * 8);
  EXPECT_EQ(opt->state(0).count("exp_avg"), 1u);
  EXPECT_EQ(opt->state(1).count("exp_avg_sq"), 1u);
  opt->step({vec(std::vector<float>(5, 0.1f)), vec(std::vector<float>(3, 0.1f))});
  EXPECT_EQ(opt->state_numel(), 2 * 8);

  auto sgd = make("sgd", {{"momentum", 0.9}});
  sgd->add_shard(vec(std::vector<float>(5, 1.0f)));
  EXPECT_EQ(sgd->state_numel(), 5);
  EXPECT_EQ(sgd->state(0).count("momentum_buffer"), 1u);
  for (const char* type : {"lion", "adagrad"}) {
    auto o = make(type);
    o->add_shard(vec(std::vector<float>(5, 1.0f)));
    EXPECT_EQ(o->state_numel(), 5) << type;
  }
}

TEST(Optimizer, SetLrAndMomentumReachEveryShard) {
  auto opt = make("adam", {{"lr", 0.01}});
  opt->add_shard(vec({1.0f}));
  opt->add_shard(vec({1.0f}), {{"lr", 0.5}});
  EXPECT_DOUBLE_EQ(opt->get_lr(0), 0.01);
  EXPECT_DOUBLE_EQ(opt->get_lr(1), 0.5);
  opt->set_lr(0.25);
  EXPECT_DOUBLE_EQ(opt->get_lr(0), 0.25);
  EXPECT_DOUBLE_EQ(opt->get_lr(1), 0.25);
  EXPECT_DOUBLE_EQ(opt->get_momentum(1), 0.9);
  opt->set_momentum(0.85);
  EXPECT_DOUBLE_EQ(opt->get_momentum(0), 0.85);
  EXPECT_DOUBLE_EQ(opt->hyper(1)["betas"][1].get<double>(), 0.999);

  auto sgd = make("SGD", {{"momentum", 0.9}});
  sgd->add_shard(vec({1.0f}));
  sgd->set_momentum(0.5);
  EXPECT_DOUBLE_EQ(sgd->get_momentum(0), 0.5);
  EXPECT_DOUBLE_EQ(sgd->hyper(0)["momentum"].get<double>(), 0.5);
}

TEST(Optimizer, DeepSpeedDefaults) {
  struct Case {
    const char* type;
    const char* key;
    double value;
  };
  for (const Case& c :
       {Case{"adam", "lr", 1e-3}, Case{"adam", "eps", 1e-8}, Case{"adam", "weight_decay", 0},
        Case{"lamb", "max_coeff", 10}, Case{"lamb", "min_coeff", 0.01}, Case{"sgd", "lr", 1e-3},
        Case{"lion", "lr", 1e-3}, Case{"adagrad", "lr", 1e-2}, Case{"adagrad", "eps", 1e-10}}) {
    auto opt = make(c.type);
    opt->add_shard(vec({1.0f}));
    EXPECT_DOUBLE_EQ(opt->hyper(0)[c.key].get<double>(), c.value) << c.type << " " << c.key;
  }
  auto adam = make("adam");
  adam->add_shard(vec({1.0f}));
  EXPECT_EQ(adam->hyper(0)["betas"], json({0.9, 0.999}));
  EXPECT_EQ(adam->hyper(0)["bias_correction"], true);
  auto lion = make("lion");
  lion->add_shard(vec({1.0f}));
  EXPECT_EQ(lion->hyper(0)["betas"], json({0.9, 0.999}));
  // torch_adam builds torch.optim.AdamW, whose weight_decay defaults to 0.01.
  auto torch_adamw = make("adamw", {{"torch_adam", true}});
  torch_adamw->add_shard(vec({1.0f}));
  EXPECT_DOUBLE_EQ(torch_adamw->hyper(0)["weight_decay"].get<double>(), 0.01);
}

TEST(Optimizer, OneBitVariantsTrainAsTheirPlainCounterparts) {
  json params = {{"lr", 0.1}, {"weight_decay", 0.1}};
  json one_bit = params;
  one_bit.update({{"freeze_step", 400}, {"cuda_aware", false}, {"comm_backend_name", "nccl"}});
  auto adam = make("adam", params);
  auto onebit = make("OneBitAdam", one_bit);
  auto zeroone = make("ZeroOneAdam", one_bit);
  EXPECT_EQ(onebit->name(), "adam");
  EXPECT_EQ(zeroone->name(), "adam");
  for (auto* o : {adam.get(), onebit.get(), zeroone.get()}) {
    o->add_shard(vec({1.0f, -2.0f}));
    o->step({vec({0.5f, 0.25f})});
    o->step({vec({-0.5f, 0.1f})});
  }
  EXPECT_EQ(values(onebit->shard(0)), values(adam->shard(0)));
  EXPECT_EQ(values(zeroone->shard(0)), values(adam->shard(0)));
  EXPECT_EQ(make("OneBitLamb", {{"freeze_step", 10}, {"factor_max", 4.0}})->name(), "lamb");
}

TEST(Optimizer, NamesAreCaseInsensitiveAndDeepSpeedOnlyParamsAreAccepted) {
  EXPECT_EQ(make("ADAMW")->name(), "adamw");
  EXPECT_EQ(make("sgd")->name(), "SGD");
  EXPECT_EQ(make("LAMB")->name(), "lamb");
  EXPECT_EQ(optimizer_error_path("adam", {{"torch_adam", false},
                                          {"adam_w_mode", true},
                                          {"fused", true},
                                          {"set_grad_none", true},
                                          {"fp32_optimizer_states", true}}),
            "");
}

TEST(Optimizer, ConfigErrorsNameTheKey) {
  EXPECT_EQ(optimizer_error_path("adamx", {}), "optimizer.type");
  EXPECT_EQ(optimizer_error_path("adam", {{"betas", {0.9}}}), "optimizer.params.betas");
  EXPECT_EQ(optimizer_error_path("adam", {{"betas", {0.9, 1.0}}}), "optimizer.params.betas");
  EXPECT_EQ(optimizer_error_path("adam", {{"lr", -1}}), "optimizer.params.lr");
  EXPECT_EQ(optimizer_error_path("adam", {{"lr", "fast"}}), "optimizer.params.lr");
  EXPECT_EQ(optimizer_error_path("adam", {{"amsgrad", true}}), "optimizer.params.amsgrad");
  EXPECT_EQ(optimizer_error_path("adamw", {{"adam_w_mode", "yes"}}),
            "optimizer.params.adam_w_mode");
  EXPECT_EQ(optimizer_error_path("adam", {{"foo", 1}}), "optimizer.params.foo");
  EXPECT_EQ(optimizer_error_path("lamb", {{"max_grad_norm", 1.0}}),
            "optimizer.params.max_grad_norm");
  EXPECT_EQ(optimizer_error_path("sgd", {{"nesterov", true}}), "optimizer.params.nesterov");
  EXPECT_EQ(optimizer_error_path("adagrad", {{"lr_decay", -0.1}}), "optimizer.params.lr_decay");
  EXPECT_EQ(optimizer_error_path("lion", {{"eps", 1e-8}}), "optimizer.params.eps");
}

TEST(Optimizer, BadShardsAndGradientsAreRejected) {
  auto opt = make("adam");
  EXPECT_THROW(opt->add_shard(at::empty({2, 2}, at::kFloat)), dscpp::Error);
  EXPECT_THROW(opt->add_shard(at::empty({2}, at::kDouble)), dscpp::Error);
  opt->add_shard(vec({1.0f, 2.0f}));
  EXPECT_THROW(opt->step({vec({1.0f})}), dscpp::Error);
  EXPECT_THROW(opt->step({}), dscpp::Error);
  try {
    opt->add_shard(vec({1.0f}), {{"lr", -1.0}});
    FAIL() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.path(), "param_groups[1].lr");
  }
}

}  // namespace

// Stepping an elementwise optimizer in ranges (ZeRO's update-then-all-gather per bucket) gives
// the same bits as one whole step; a non-elementwise one refuses.
TEST(OptimizerRanges, AdamInRangesEqualsOneStepBitForBit) {
  std::vector<float> p0, g0;
  for (int i = 0; i < 1003; ++i) {
    p0.push_back(std::sin(0.37f * i));
    g0.push_back(std::cos(0.11f * i) * (i % 7 == 0 ? 10.0f : 0.1f));
  }
  auto whole = make("AdamW", {{"lr", 0.01}, {"weight_decay", 0.1}});
  auto parts = make("AdamW", {{"lr", 0.01}, {"weight_decay", 0.1}});
  at::Tensor pw = vec(p0), pp = vec(p0), g = vec(g0);
  whole->add_shard(pw);
  parts->add_shard(pp);
  ASSERT_TRUE(parts->elementwise());
  for (int step = 0; step < 3; ++step) {
    whole->step({g});
    parts->begin_step();
    const int64_t cuts[] = {0, 5, 517, 1003};
    for (int r = 0; r < 3; ++r) {
      // The range's 16-bit copy (ZeRO's published weights): the updated range as to() casts it.
      at::Tensor copy = at::full({cuts[r + 1] - cuts[r]}, 7.0, at::kBFloat16);
      parts->update_range(0, cuts[r], cuts[r + 1], g.slice(0, cuts[r], cuts[r + 1]), {}, copy);
      EXPECT_TRUE(at::equal(copy, pp.slice(0, cuts[r], cuts[r + 1]).to(at::kBFloat16)));
    }
  }
  EXPECT_THROW(parts->update_range(0, 0, 5, g.slice(0, 0, 5), {}, at::zeros({4}, at::kBFloat16)),
               dscpp::Error);
  EXPECT_EQ(values(pw), values(pp));
  EXPECT_EQ(values(whole->state(0).at("exp_avg")), values(parts->state(0).at("exp_avg")));
  EXPECT_EQ(values(whole->state(0).at("exp_avg_sq")), values(parts->state(0).at("exp_avg_sq")));
  EXPECT_EQ(whole->step_count(0), parts->step_count(0));
  EXPECT_THROW(parts->update_range(0, 1000, 1004, g.slice(0, 0, 4)), dscpp::Error);

  auto lamb = make("Lamb");
  lamb->add_shard(vec(p0));
  EXPECT_FALSE(lamb->elementwise());
  EXPECT_THROW(lamb->begin_step(), dscpp::Error);
}

// ZeRO-Offload's CPU kernels (set_cpu_kernels) step Adam, AdamW, Adagrad and Lion as the ATen
// path does (within fp32 reordering), whole or in ranges, with a fused grad scale, a bf16
// gradient and a bf16 param copy; other optimizers do not take them.
TEST(CpuKernels, StepLikeTheATenPathWholeAndInRanges) {
  for (const std::string type : {"adam", "adamw", "adagrad", "lion"}) {
    json params = {{"lr", 0.01}, {"weight_decay", 0.1}};
    auto aten = make(type, params), fast = make(type, params);
    fast->set_cpu_kernels(true);
    ASSERT_TRUE(fast->cpu_kernels()) << type;
    at::manual_seed(3);
    at::Tensor p0 = at::randn({3001});
    at::Tensor a = p0.clone(), b = p0.clone();
    aten->add_shard(a);
    fast->add_shard(b);
    ASSERT_TRUE(fast->fuses_grad_scale() && fast->reads_16bit_grads());
    for (int step = 0; step < 3; ++step) {
      at::Tensor g = at::randn({3001}).to(at::kBFloat16);
      at::Tensor scale = at::full({}, 0.5f);
      aten->step({g.to(at::kFloat).mul(0.5)});
      if (step == 1) {
        fast->step({g}, scale);
        continue;
      }
      fast->begin_step();
      at::Tensor copy = at::zeros({3001}, at::kBFloat16);
      fast->update_range(0, 0, 1000, g.narrow(0, 0, 1000), scale, copy.narrow(0, 0, 1000));
      fast->update_range(0, 1000, 3001, g.narrow(0, 1000, 2001), scale, copy.narrow(0, 1000, 2001));
      EXPECT_TRUE(at::equal(copy, b.to(at::kBFloat16))) << type;
    }
    const double err = a.sub(b).norm().item<double>() / a.norm().item<double>();
    EXPECT_LT(err, 1e-6) << type;
  }
  auto sgd = make("sgd");
  sgd->set_cpu_kernels(true);
  EXPECT_FALSE(sgd->cpu_kernels());
}
