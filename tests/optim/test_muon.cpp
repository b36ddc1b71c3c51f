// Muon on ZeRO's shards (optim/muon.h): a shard holding a matrix, padding and a stacked expert
// group steps each of them whole, as DeepSpeed's MuonWithAuxAdam steps a Muon group: the
// reference applies optim::muon_update (itself checked against DeepSpeed's, muon_update_oracle)
// to each parameter by hand, then p <- p (1 - lr wd) - lr update.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <array>
#include <functional>
#include <string>
#include <vector>

#include "dscpp/config/config_error.h"
#include "dscpp/optim/muon.h"
#include "dscpp/optim/muon_update.h"

namespace optim = dscpp::optim;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(MuonShards, EachMatrixOfAShardStepsWholeAsDeepSpeedsMuonGroup) {
  for (const std::string method : {"gram", "standard"}) {
    SCOPED_TRACE(method);
    const double lr = 0.03, wd = 0.1, beta = 0.9;
    optim::Muon muon(nlohmann::json{
        {"lr", lr}, {"weight_decay", wd}, {"momentum", beta}, {"ns_method", method}});
    // [8, 12] at 0, 4 elements of padding, an expert group [3, 6, 4] at 100.
    at::manual_seed(11);
    at::Tensor shard = at::randn({172});
    const at::Tensor start = shard.clone();
    ASSERT_EQ(muon.add_shard(shard), 0);
    muon.set_shard_params(0, {{0, {8, 12}}, {100, {3, 6, 4}}});
    at::Tensor a = start.narrow(0, 0, 96).view({8, 12}).clone();
    at::Tensor e = start.narrow(0, 100, 72).view({3, 6, 4}).clone();
    at::Tensor ma = at::zeros_like(a), me = at::zeros_like(e);
    optim::MuonUpdateOptions o;
    o.beta = beta;
    o.method = optim::ns_method_from(method);
    for (int step = 0; step < 3; ++step) {
      const at::Tensor grad = at::randn({172});
      muon.step({grad});
      at::Tensor ga = grad.narrow(0, 0, 96).view({8, 12}).clone();
      at::Tensor ge = grad.narrow(0, 100, 72).view({3, 6, 4}).clone();
      o.expert_group = false;
      const at::Tensor ua = optim::muon_update(ga, ma, o);
      o.expert_group = true;
      const at::Tensor ue = optim::muon_update(ge, me, o);
      a.mul_(1 - lr * wd).add_(ua, -lr);
      e.mul_(1 - lr * wd).add_(ue, -lr);
      EXPECT_TRUE(at::equal(shard.narrow(0, 0, 96).view({8, 12}), a)) << "step " << step;
      EXPECT_TRUE(at::equal(shard.narrow(0, 100, 72).view({3, 6, 4}), e)) << "step " << step;
      EXPECT_TRUE(at::equal(shard.narrow(0, 96, 4), start.narrow(0, 96, 4)));  // padding
    }
    EXPECT_TRUE(at::equal(muon.state(0).at("momentum_buffer").narrow(0, 0, 96).view({8, 12}), ma));
    EXPECT_EQ(muon.orthogonalised(), 6);
  }
}

TEST(MuonShards, DeepSpeedsDefaultsAndWrongSettingsNamed) {
  optim::Muon muon(nlohmann::json::object());
  EXPECT_EQ(muon.get_lr(), 0.02);
  EXPECT_EQ(muon.get_momentum(), 0.95);
  EXPECT_TRUE(muon.needs_whole_params());
  const std::string method = error_of([] { optim::Muon(nlohmann::json{{"ns_method", "svd"}}); });
  EXPECT_NE(method.find("optimizer.params.ns_method"), std::string::npos) << method;
  EXPECT_NE(error_of([] {
              optim::Muon(nlohmann::json{{"nesterov", false}});
            }).find("nesterov"),
            std::string::npos);
}

TEST(MuonShards, AParameterNotWholeInItsShardOrAShardWithoutThemIsRefused) {
  optim::Muon muon(nlohmann::json::object());
  muon.add_shard(at::zeros({50}));
  EXPECT_THROW(muon.set_shard_params(0, {{10, {8, 6}}}), optim::MuonError);  // 48 from 10
  EXPECT_THROW(muon.set_shard_params(0, {{0, {50}}}), optim::MuonError);     // not a matrix
  const std::string e = error_of([&] { muon.step({at::ones({50})}); });
  EXPECT_NE(e.find("whole"), std::string::npos) << e;
}

namespace {

// Levanter's MuonH for one matrix (lib/levanter/src/levanter/optim/muonh.py and its
// zeropower_via_newtonschulz5), written out in float64 from the published definition.
struct HyperballReference {
  double lr, momentum, eps;
  bool nesterov;
  std::vector<std::array<double, 3>> coefficients;
  at::Tensor buf;
  void step(at::Tensor& p, const at::Tensor& g) {
    buf = buf * momentum + g;
    at::Tensor u = nesterov ? buf * momentum + g : buf;
    at::Tensor x = u / (u.norm() + eps);
    const bool transpose = x.size(0) > x.size(1);
    if (transpose) x = x.t();
    for (int i = 0; i < 5; ++i) {
      const auto& [a, b, c] = coefficients[i % coefficients.size()];
      const at::Tensor A = x.mm(x.t());
      x = a * x + (b * A + c * A.mm(A)).mm(x);
    }
    if (transpose) x = x.t();
    const at::Tensor moved = p - lr * x * p.norm() / at::clamp_min(x.norm(), 1e-10);
    p = moved / moved.norm() * p.norm();
  }
};

}  // namespace

// MuonH (Marin's Muon on the hyperball, optim/muonh_update.h): a shard of a wide and a tall
// matrix steps each as the float64 transcription of Levanter's definition does (within fp32's
// rounding), with both coefficient sets and without Nesterov; every matrix keeps its norm.
TEST(MuonShards, MuonHStepsEachMatrixAsLevantersDefinition) {
  const std::vector<std::array<double, 3>> quintic = {{4.0848, -6.8946, 2.9270},
                                                      {3.9505, -6.3029, 2.6377},
                                                      {3.7418, -5.5913, 2.3037},
                                                      {2.8769, -3.1427, 1.2046},
                                                      {2.8366, -3.0525, 1.2012}};
  const std::vector<std::array<double, 3>> simple = {{3.4445, -4.7750, 2.0315}};
  for (const auto& [name, nesterov] : std::vector<std::pair<std::string, bool>>{
           {"quintic", true}, {"simple", true}, {"quintic", false}}) {
    SCOPED_TRACE(name + (nesterov ? "" : ", no Nesterov"));
    const double lr = 0.05, momentum = 0.9;
    optim::Muon muonh(
        nlohmann::json{
            {"lr", lr}, {"momentum", momentum}, {"nesterov", nesterov}, {"coefficient_type", name}},
        optim::Muon::Rule::Hyperball);
    at::manual_seed(3);
    at::Tensor shard = at::randn({96 + 60});
    ASSERT_EQ(muonh.add_shard(shard), 0);
    muonh.set_shard_params(0, {{0, {8, 12}}, {96, {12, 5}}});
    std::vector<at::Tensor> want = {shard.narrow(0, 0, 96).view({8, 12}).to(at::kDouble),
                                    shard.narrow(0, 96, 60).view({12, 5}).to(at::kDouble)};
    const std::vector<at::Tensor> start = {want[0].clone(), want[1].clone()};
    const std::vector<double> norms = {want[0].norm().item<double>(),
                                       want[1].norm().item<double>()};
    std::vector<HyperballReference> ref(
        2, {lr, momentum, 1e-8, nesterov, name == "quintic" ? quintic : simple, {}});
    ref[0].buf = at::zeros_like(want[0]);
    ref[1].buf = at::zeros_like(want[1]);
    for (int step = 0; step < 4; ++step) {
      const at::Tensor grad = at::randn({156});
      muonh.step({grad});
      ref[0].step(want[0], grad.narrow(0, 0, 96).view({8, 12}).to(at::kDouble));
      ref[1].step(want[1], grad.narrow(0, 96, 60).view({12, 5}).to(at::kDouble));
      const std::vector<at::Tensor> got = {shard.narrow(0, 0, 96).view({8, 12}),
                                           shard.narrow(0, 96, 60).view({12, 5})};
      for (int i = 0; i < 2; ++i) {
        const double err = (got[i].to(at::kDouble) - want[i]).abs().max().item<double>();
        EXPECT_LT(err, 1e-5) << "matrix " << i << " step " << step;
        EXPECT_NEAR(got[i].norm().item<double>(), norms[i], 1e-5 * norms[i]) << "matrix " << i;
      }
    }
    // (the steps moved the matrices: by lr of their norm each, about)
    for (int i = 0; i < 2; ++i)
      EXPECT_GT((want[i] - start[i]).norm().item<double>(), lr * norms[i]) << "matrix " << i;
  }
}

// MuonH's config: Levanter's names and defaults, the Adam half without weight decay; a wrong
// value is named.
TEST(MuonShards, MuonHConfigTakesLevantersNames) {
  dscpp::OptimizerConfig c;
  c.type = "MuonH";
  c.params = {{"lr", 0.01}, {"adam_lr", 1e-3}, {"beta2", 0.98}, {"backend_steps", 4}};
  const optim::MuonHalves h = optim::make_muon_halves(c);
  EXPECT_EQ(h.muon->name(), "muonh");
  EXPECT_DOUBLE_EQ(h.muon->get_lr(), 0.01);
  EXPECT_DOUBLE_EQ(h.adam->get_lr(), 1e-3);
  EXPECT_TRUE(optim::is_muon(c));
  c.params = {{"coefficient_type", "cubic"}};
  EXPECT_NE(error_of([&] { optim::make_muon_halves(c); }).find("coefficient_type"),
            std::string::npos);
  c.params = {{"weight_decay", 0.1}};
  EXPECT_NE(error_of([&] { optim::make_muon_halves(c); }).find("weight_decay"), std::string::npos);
}
