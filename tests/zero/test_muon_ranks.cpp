// Muon in ZeRO (optim/muon.h, FlatLayout::build_whole): every matrix lies whole in one rank's
// partition, its owner orthogonalises it, and ZeRO's publish brings the result to the others.
// Run by the launcher on 1, 2 and 3 Gloo ranks, at stages 0-3: matrices of several shapes and
// a stacked expert group, each rank's own gradients; after three steps every rank's weights
// equal one Muon stepping the whole model with the ranks' mean gradient (within 1e-5), and the
// group orthogonalised each matrix once a step: the ranks' counts sum to matrices x steps, and
// with more matrices than ranks every rank did some of it. The same at stages 1-3 under
// ZeRO-Offload (the master, the momentum and the gradient partition on the host, each matrix's
// update computed on the training device: here the CPU too). And so does Marin's MuonH.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "dscpp/comm/rendezvous.h"
#include "dscpp/optim/muon.h"
#include "dscpp/zero/zero_optimizer.h"

namespace {

std::shared_ptr<dscpp::comm::ProcessGroup> world;

constexpr int kSteps = 3;
const std::vector<std::vector<int64_t>> kShapes = {
    {16, 24}, {24, 16}, {32, 32}, {8, 40}, {2, 8, 12}};
const nlohmann::json kMuon = {{"lr", 0.05}, {"weight_decay", 0.1}, {"momentum", 0.9}};

// Rank r's gradient of parameter i at step s (the same on every process), in multiples of
// 2^-6: the ranks' sum is exact in any order, so the mean is the same bits on both sides
// (Newton-Schulz in half precision, gram's fp16 on a CPU that has it, would carry a last-bit
// difference of the sums into whole units of its own last place).
at::Tensor grad_of(int r, size_t i, int s) {
  auto gen = at::detail::createCPUGenerator(1000 * r + 10 * static_cast<int>(i) + s);
  return at::round(at::randn(kShapes[i], gen) * 64) / 64;
}

std::vector<at::Tensor> initial() {
  auto gen = at::detail::createCPUGenerator(7);
  std::vector<at::Tensor> out;
  for (const auto& s : kShapes) out.push_back(at::randn(s, gen).mul(0.2));
  return out;
}

using Rule = dscpp::optim::Muon::Rule;

// Every (stage, offload) case trains as one optimizer of `rule` over the whole model.
void trains_as_one(Rule rule, const nlohmann::json& settings,
                   const std::vector<std::pair<int, bool>>& cases) {
  const int n = world->size(), rank = world->rank();
  for (const auto& [stage, offload] : cases) {
    SCOPED_TRACE("stage " + std::to_string(stage) + (offload ? ", offload" : ""));
    std::vector<at::Tensor> params;
    for (const auto& p : initial()) params.push_back(p.clone().requires_grad_(true));
    dscpp::zero::ZeroOptions o;
    o.stage = stage;
    o.reduce_bucket_size = 600;  // several buckets
    o.offload.enabled = offload;
    o.offload.host_gradients = offload;  // (as the engine sets it)
    auto zero = std::make_unique<dscpp::zero::ZeroOptimizer>(
        params, std::make_unique<dscpp::optim::Muon>(settings, rule), world, o);
    for (int s = 0; s < kSteps; ++s) {
      zero->gather();
      zero->begin_backward(true);
      at::Tensor loss = at::zeros({});
      for (size_t i = 0; i < params.size(); ++i)
        loss = loss + (params[i] * grad_of(rank, i, s)).sum();
      loss.backward();
      zero->end_backward();
      zero->release();
      zero->step(1.0);
    }
    zero->gather();
    // One Muon over the whole model, one shard, the ranks' mean gradients.
    dscpp::optim::Muon one(settings, rule);
    std::vector<at::Tensor> flat;
    std::vector<dscpp::optim::Optimizer::ShardParam> where;
    int64_t offset = 0;
    for (const auto& p : initial()) {
      flat.push_back(p.flatten());
      where.push_back({offset, p.sizes().vec()});
      offset += p.numel();
    }
    at::Tensor shard = at::cat(flat);
    one.add_shard(shard);
    one.set_shard_params(0, where);
    for (int s = 0; s < kSteps; ++s) {
      std::vector<at::Tensor> g;
      for (size_t i = 0; i < kShapes.size(); ++i) {
        at::Tensor sum = at::zeros(kShapes[i]);
        for (int r = 0; r < n; ++r) sum.add_(grad_of(r, i, s));
        g.push_back(sum.div_(n).flatten());
      }
      one.step({at::cat(g)});
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor want = shard.narrow(0, where[i].offset, params[i].numel()).view(kShapes[i]);
      const double err =
          (params[i].detach() - want).abs().max().item<double>() / want.abs().max().item<double>();
      EXPECT_LT(err, 1e-5) << "parameter " << i;
    }
    // The work: each matrix once a step in the group, spread over the ranks.
    const auto& muon = dynamic_cast<const dscpp::optim::Muon&>(zero->optimizer());
    at::Tensor count = at::tensor({static_cast<double>(muon.orthogonalised())}, at::kDouble);
    world->all_reduce(count).wait();
    // (stage 0 holds everything on every rank, as data parallelism without ZeRO does)
    const int64_t once = static_cast<int64_t>(kShapes.size()) * kSteps;
    EXPECT_EQ(count.item<double>(), static_cast<double>((stage == 0 ? n : 1) * once));
    if (stage >= 1 && n > 1) {
      EXPECT_GT(muon.orthogonalised(), 0) << "rank " << rank << " orthogonalised nothing";
      EXPECT_LT(muon.orthogonalised(), once) << "rank " << rank << " orthogonalised every matrix";
    }
    zero.reset();
    world->barrier().wait();
  }
}

}  // namespace

TEST(MuonRanks, TrainsAsOneMuonAndOrthogonalisesEachMatrixOnce) {
  trains_as_one(Rule::DeepSpeed, kMuon,
                {{0, false}, {1, false}, {2, false}, {3, false}, {1, true}, {2, true}, {3, true}});
}

// Marin's MuonH (the hyperball's norms are each whole matrix's, which its owner holds).
TEST(MuonRanks, MuonHTrainsAsOneMuonH) {
  trains_as_one(Rule::Hyperball, {{"lr", 0.05}, {"momentum", 0.9}},
                {{0, false}, {2, false}, {3, false}, {2, true}});
}

// The optimizer's NVMe offload and a partial offload step the partition a piece at a time, so
// no matrix is whole there: refused, naming what to use instead.
TEST(MuonRanks, PiecewiseOffloadsAreRefused) {
  for (bool nvme : {true, false}) {
    std::vector<at::Tensor> params;
    for (const auto& p : initial()) params.push_back(p.clone().requires_grad_(true));
    dscpp::zero::ZeroOptions o;
    o.stage = 3;
    o.offload.enabled = true;
    o.offload.nvme.enabled = nvme;
    o.offload.ratio = nvme ? 1.0 : 0.5;
    try {
      dscpp::zero::ZeroOptimizer z(params, std::make_unique<dscpp::optim::Muon>(kMuon), world, o);
      ADD_FAILURE() << (nvme ? "NVMe" : "a partial") << " offload of Muon was accepted";
    } catch (const dscpp::Error& e) {
      EXPECT_NE(std::string(e.what()).find("ratio 1"), std::string::npos) << e.what();
    }
  }
}

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  dscpp::comm::InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(30);
  world = dscpp::comm::init_distributed(options);
  const int rc = RUN_ALL_TESTS();
  world->barrier().wait();
  world.reset();
  return rc;
}
