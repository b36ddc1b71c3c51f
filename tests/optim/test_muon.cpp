// Muon on ZeRO's shards (optim/muon.h): a shard holding a matrix, padding and a stacked expert
// group steps each of them whole, as DeepSpeed's MuonWithAuxAdam steps a Muon group: the
// reference applies optim::muon_update (itself checked against DeepSpeed's, muon_update_oracle)
// to each parameter by hand, then p <- p (1 - lr wd) - lr update.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

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
