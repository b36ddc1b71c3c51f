// The MoE layer at expert parallelism 2 and 4 (nn/moe/moe.h, ep_group) on real Gloo ranks,
// against expert parallelism 1 on the same data world: every rank builds the one-rank layer
// holding all experts (the same weights; the EP layer holds its rank's slice of the experts)
// and runs it on each rank's own tokens (capacity and l_aux are per rank, as DeepSpeed's).
// Built after the same seed, the EP layer must hold exactly the one-rank layer's slice (the
// experts' initialisation by global id) and leave the default generator where it does.
// Each rank's EP output, l_aux, exp_counts and input, gate and shared-expert gradients must
// equal the one-rank layer on its tokens; its local experts' gradients must equal the sum over
// its expert-parallel group of the one-rank layer's gradients of the matching experts, and,
// after the expert-data-parallel all-reduce (done here as the engine will), the sum over the
// whole data world. fp32, 1e-5 relative.
//
// Cases: top-1, top-2, top-8; capacity (factor 0.5: tokens dropped) and dropless; shared
// expert on and off; grouped experts (GroupedMLP) and clones of an ExpertMLP; LatentMoE on/off.
// Without --full a few cases that cover every value once; --full: every combination.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "dscpp/comm/expert_groups.h"
#include "dscpp/comm/rendezvous.h"
#include "dscpp/nn/moe/moe.h"
#include "tests/moe_test_util.h"

using dscpp::comm::ProcessGroup;
using moe_test::Case, moe_test::kExperts, moe_test::kFfn, moe_test::kHidden, moe_test::moe_options;
namespace moe = dscpp::nn::moe;

namespace {

std::shared_ptr<ProcessGroup> world;
bool full = false;

constexpr int64_t kBatch = 2, kSeq = 12;

// A case of this test, as moe_test's case string of the fields the layer (moe_options) reads.
Case case_of(int ep, int k, bool dropless, bool shared, bool clones, bool latent = false) {
  const auto field = [](char letter, int v) { return letter + std::to_string(v); };
  return moe_test::parse_case(field('e', ep) + field('k', k) + field('d', dropless) +
                                  field('s', shared) + field('c', clones) + field('l', latent),
                              "ekdscl", "moe_ep_layer");
}

std::string name_of(const Case& c) {
  return "ep " + std::to_string(c.ep) + " top-" + std::to_string(c.k) +
         (c.dropless ? " dropless" : " capacity") + (c.shared ? " shared" : "") +
         (c.clones ? " clones" : " grouped") + (c.latent ? " latent" : "");
}

at::Tensor seeded_randn(at::IntArrayRef sizes, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randn(sizes, gen, at::TensorOptions().dtype(at::kFloat));
}

// The one-rank layer's tensor that the EP layer's `name` (on expert-parallel rank r, E_l local
// experts) holds: the same name, or the matching slice of the experts.
at::Tensor counterpart(const std::map<std::string, at::Tensor>& ref, const std::string& name, int r,
                       int64_t local) {
  const std::string clones = "deepspeed_moe.experts.deepspeed_experts.";
  if (name.rfind(clones, 0) == 0) {
    const size_t dot = name.find('.', clones.size());
    const int64_t i = std::stoll(name.substr(clones.size(), dot - clones.size()));
    return ref.at(clones + std::to_string(r * local + i) + name.substr(dot));
  }
  if (name.rfind("deepspeed_moe.experts.", 0) == 0)
    return ref.at(name).narrow(0, r * local, local);  // GroupedMLP's stacked weights
  return ref.at(name);
}

bool is_expert(const std::string& name) {
  return name.rfind("deepspeed_moe.experts.", 0) == 0;
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double scale = std::max(1.0, want.abs().max().item<double>());
  const double err = (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>();
  EXPECT_LE(err, 1e-5 * scale) << what;
}

struct Result {
  at::Tensor out, l_aux, counts, d_input;
  std::map<std::string, at::Tensor> grads;
};

Result run(moe::MoE& layer, int rank_of_data) {
  for (auto& p : layer->parameters()) p.mutable_grad() = at::Tensor();
  at::Tensor x = seeded_randn({kBatch, kSeq, kHidden}, 100 + rank_of_data).requires_grad_(true);
  at::Tensor g = seeded_randn({kBatch, kSeq, kHidden}, 200 + rank_of_data);
  auto y = layer->forward(x);
  at::Tensor loss = (y.output * g).sum() + 0.1 * y.l_aux;
  loss.backward();
  Result r{y.output.detach(), y.l_aux.detach(), y.exp_counts, x.grad(), {}};
  for (const auto& p : layer->named_parameters())
    r.grads[p.key()] =
        p.value().grad().defined() ? p.value().grad().clone() : at::zeros_like(p.value());
  return r;
}

void run_case(const Case& c, const dscpp::comm::ExpertGroups& groups) {
  const int n = world->size(), me = world->rank();
  const int r = groups.expert_parallel->rank();
  const int64_t local = kExperts / c.ep;
  SCOPED_TRACE(name_of(c) + " rank " + std::to_string(me));

  // Both built after the same seed: the EP layer's experts are the one-rank layer's (each
  // drawn by its global id, or clones of the same module), bit for bit, and the default
  // generator is left in the same state (what a model builds next agrees too).
  at::manual_seed(7);
  moe::MoE ref(moe_options(c, 1, nullptr));
  const at::Tensor after_ref = at::rand({4});
  at::manual_seed(7);
  moe::MoE ep(moe_options(c, c.ep, groups.expert_parallel));
  const at::Tensor after_ep = at::rand({4});
  EXPECT_TRUE(at::equal(after_ref, after_ep)) << "the default generator after the layers";
  std::map<std::string, at::Tensor> ref_params;
  for (const auto& p : ref->named_parameters()) ref_params[p.key()] = p.value();
  for (const auto& p : ep->named_parameters())
    EXPECT_TRUE(at::equal(p.value(), counterpart(ref_params, p.key(), r, local)))
        << "initial " << p.key() << " is not the one-rank layer's";
  EXPECT_EQ(ep->parameters().size(),
            ref->parameters().size() - (c.clones ? (kExperts - local) * 4 : 0));

  Result mine = run(ep, me);
  std::vector<Result> ref_of(n);
  for (int s = 0; s < n; ++s) ref_of[s] = run(ref, s);

  const Result& want = ref_of[me];
  expect_close(mine.out, want.out, "output");
  expect_close(mine.l_aux, want.l_aux, "l_aux");
  EXPECT_TRUE(at::equal(mine.counts, want.counts)) << "exp_counts";
  if (!c.dropless) {  // DeepSpeed's capacity for these sizes; some expert must be over it
    const int64_t capacity =
        std::max<int64_t>(static_cast<int64_t>(std::ceil(kBatch * kSeq * 0.5 * c.k / kExperts)), 2);
    EXPECT_GT(mine.counts.max().item<int64_t>(), capacity) << "no token dropped";
  }
  expect_close(mine.d_input, want.d_input, "d_input");
  for (auto& [name, grad] : mine.grads) {
    if (!is_expert(name)) {
      expect_close(grad, counterpart(want.grads, name, r, local), name);
      continue;
    }
    // This rank's experts saw the tokens of its whole expert-parallel group ...
    at::Tensor over_group = at::zeros_like(grad, at::kDouble), over_world = over_group.clone();
    for (int s = 0; s < n; ++s) {
      at::Tensor part = counterpart(ref_of[s].grads, name, r, local).to(at::kDouble);
      over_world += part;
      for (int i = 0; i < c.ep; ++i)
        if (groups.expert_parallel->global_rank(i) == s) over_group += part;
    }
    expect_close(grad, over_group, name + " over the expert-parallel group");
    // ... and reduced over the expert-data group, the whole data world's batch.
    at::Tensor reduced = grad.contiguous();
    groups.expert_data_parallel->all_reduce(reduced).wait();
    expect_close(reduced, over_world, name + " over the expert-data group");
  }
}

TEST(MoEExpertParallel, EqualsExpertParallelOneOnTheSameDataWorld) {
  const int n = world->size();
  std::vector<Case> cases;
  std::vector<int> eps;
  for (int ep = 2; ep <= n; ep *= 2)
    if (n % ep == 0) eps.push_back(ep);
  if (full) {
    for (int ep : eps)
      for (int k : {1, 2, 8})
        for (bool dropless : {false, true})
          for (bool shared : {false, true})
            for (bool clones : {false, true})
              for (bool latent : {false, true})
                cases.push_back(case_of(ep, k, dropless, shared, clones, latent));
  } else {
    const int big = eps.back();
    cases = {case_of(eps.front(), 1, false, false, false), case_of(big, 2, true, true, true, true),
             case_of(big, 8, false, false, false), case_of(eps.front(), 8, true, true, false)};
  }
  dscpp::comm::Topology topo({"data", "model"}, {n, 1});
  std::map<int, dscpp::comm::ExpertGroups> groups;
  for (int ep : eps) groups[ep] = dscpp::comm::new_expert_groups(*world, topo, ep);
  for (const auto& c : cases) run_case(c, groups.at(c.ep));
}

TEST(MoEExpertParallel, RefusesAGroupOfAnotherSize) {
  auto o = moe::MoEOptions(kHidden).num_experts(kExperts).ffn_hidden_size(kFfn);
  try {
    moe::MoE layer(moe::MoEOptions(o).ep_size(2 * world->size()).ep_group(world));
    ADD_FAILURE() << "accepted a group of " << world->size() << " for ep_size "
                  << 2 * world->size();
  } catch (const dscpp::Error& err) {
    EXPECT_NE(std::string(err.what()).find("got a group of " + std::to_string(world->size())),
              std::string::npos)
        << err.what();
  }
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) full = full || std::string(argv[i]) == "--full";
  dscpp::comm::InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(60);
  world = dscpp::comm::init_distributed(options);
  std::cout << "moe_ep_layer: rank " << world->rank() << " of " << world->size()
            << (full ? " (full)" : "") << "\n";
  const int rc = RUN_ALL_TESTS();
  world->barrier().wait();
  world.reset();
  return rc;
}
