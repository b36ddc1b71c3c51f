// The mappings' forward and backward against hand-computed results on each model group, and
// the RNG tracker: Megatron's seeds, dropout that agrees across tensor-parallel ranks outside
// fork() and differs inside it, the default generator untouched by a fork, the states' round
// trip through get_states / set_states.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "dscpp/nn/rng_tracker.h"
#include "dscpp/nn/tensor_parallel_mappings.h"
#include "tp_test_util.h"

using namespace dscpp::nn;  // NOLINT: the mappings' long names, in a test
using tp_test::chunk;
using tp_test::draw;
using tp_test::gather_all;
using tp_test::model_groups;
using tp_test::rel_close;

namespace {

// y = map(x); backward with upstream gradient `up`; returns (y, x.grad).
template <typename F>
std::pair<at::Tensor, at::Tensor> run(F map, const at::Tensor& x0, const at::Tensor& up) {
  at::Tensor x = x0.detach().clone().requires_grad_();
  at::Tensor y = map(x);
  y.backward(up);
  return {y.detach(), x.grad()};
}

TEST(TensorParallelMappings, ForwardAndBackwardAreTheConjugateCollectives) {
  for (const auto& g : model_groups()) {
    SCOPED_TRACE(g.name);
    const int t = g.t();
    const double tri = t * (t + 1) / 2.0;  // sum over ranks of (rank + 1)
    const auto& G = g.group;
    const at::Tensor X = draw({2 * t, 3 * t}, 61, at::kFloat);
    const at::Tensor R = draw({2 * t, 3 * t}, 62, at::kFloat);
    const at::Tensor mine = X * (g.r() + 1);  // differs per rank

    auto [y, dx] = run([&](auto x) { return copy_to_tensor_model_parallel_region(x, G); }, X, R);
    EXPECT_TRUE(at::equal(y, X));
    EXPECT_TRUE(rel_close(dx, R * t));

    std::tie(y, dx) =
        run([&](auto x) { return reduce_from_tensor_model_parallel_region(x, G); }, mine, R);
    EXPECT_TRUE(rel_close(y, X * tri));
    EXPECT_TRUE(at::equal(dx, R));

    std::tie(y, dx) = run([&](auto x) { return scatter_to_tensor_model_parallel_region(x, G); }, X,
                          chunk(R, -1, g));
    EXPECT_TRUE(at::equal(y, chunk(X, -1, g)));
    EXPECT_TRUE(at::equal(dx, R));

    std::tie(y, dx) = run([&](auto x) { return gather_from_tensor_model_parallel_region(x, G); },
                          chunk(X, -1, g), R);
    EXPECT_TRUE(at::equal(y, X));
    EXPECT_TRUE(at::equal(dx, chunk(R, -1, g)));

    std::tie(y, dx) =
        run([&](auto x) { return scatter_to_sequence_parallel_region(x, G); }, X, chunk(R, 0, g));
    EXPECT_TRUE(at::equal(y, chunk(X, 0, g)));
    EXPECT_TRUE(at::equal(dx, R));

    std::tie(y, dx) =
        run([&](auto x) { return gather_from_sequence_parallel_region(x, G); }, chunk(X, 0, g), R);
    EXPECT_TRUE(at::equal(y, X));
    EXPECT_TRUE(rel_close(dx, chunk(R, 0, g) * t));  // every rank's partial gradient summed
    std::tie(y, dx) = run([&](auto x) { return gather_from_sequence_parallel_region(x, G, false); },
                          chunk(X, 0, g), R);
    EXPECT_TRUE(at::equal(dx, chunk(R, 0, g)));  // the whole gradient: this rank's part

    std::tie(y, dx) = run([&](auto x) { return reduce_scatter_to_sequence_parallel_region(x, G); },
                          mine, chunk(R, 0, g));
    EXPECT_TRUE(rel_close(y, chunk(X, 0, g) * tri));
    EXPECT_TRUE(at::equal(dx, R));

    // One rank (a null group): the identity, the tensor itself.
    EXPECT_TRUE(copy_to_tensor_model_parallel_region(X, nullptr).is_same(X));
    EXPECT_TRUE(reduce_scatter_to_sequence_parallel_region(X, nullptr).is_same(X));
    // A dimension that does not split is named, not cut unevenly.
    EXPECT_THROW(scatter_to_sequence_parallel_region(at::zeros({2 * t + 1, 2}), G),
                 TensorParallelError);
  }
}

TEST(RNGTracker, MegatronSeedsAgreeOutsideForkAndDifferInside) {
  for (const auto& g : model_groups()) {
    SCOPED_TRACE(g.name);
    model_parallel_cuda_manual_seed(1234, g.r());
    RNGStatesTracker& tracker = get_cuda_rng_tracker();
    ASSERT_TRUE(tracker.has(kModelParallelRngTrackerName));

    // Replicated regions: the default generator, seeded alike on every rank.
    const at::Tensor ones = at::ones({256});
    const at::Tensor replicated = at::dropout(ones, 0.5, true);
    at::Tensor split;
    {
      auto fork = tracker.fork();
      split = at::dropout(ones, 0.5, true);
    }
    const at::Tensor all_replicated = gather_all(replicated, g);
    const at::Tensor all_split = gather_all(split, g);
    for (int i = 0; i < g.t(); ++i) {
      EXPECT_TRUE(at::equal(all_replicated[i], replicated));
      for (int j = 0; j < i; ++j) EXPECT_FALSE(at::equal(all_split[i], all_split[j])) << i << j;
    }

    // The seeds are Megatron's: seed for the default, seed + 2718 + tp_rank for the fork.
    model_parallel_cuda_manual_seed(1234, g.r());
    const at::Tensor a = at::rand({16});
    at::Tensor b;
    {
      auto fork = tracker.fork();
      b = at::rand({16});
    }
    EXPECT_TRUE(at::equal(a, at::rand({16}, at::detail::createCPUGenerator(1234))));
    EXPECT_TRUE(at::equal(b, at::rand({16}, at::detail::createCPUGenerator(1234 + 2718 + g.r()))));
  }
}

TEST(RNGTracker, ForkLeavesTheDefaultStreamAsItWas) {
  model_parallel_cuda_manual_seed(77, 0);
  at::manual_seed(5);
  const at::Tensor a1 = at::rand({8});
  {
    auto fork = get_cuda_rng_tracker().fork();
    (void)at::rand({100});
  }
  const at::Tensor a2 = at::rand({8});
  at::manual_seed(5);
  EXPECT_TRUE(at::equal(a1, at::rand({8})));
  EXPECT_TRUE(at::equal(a2, at::rand({8})));
}

TEST(RNGTracker, StatesRoundTripForCheckpoints) {
  model_parallel_cuda_manual_seed(99, 1);
  RNGStatesTracker& tracker = get_cuda_rng_tracker();
  tracker.add("extra", 4242);
  const auto saved = tracker.get_states();
  ASSERT_EQ(saved.size(), 2u);
  at::Tensor u1, u2, v1, v2;
  {
    auto fork = tracker.fork();
    u1 = at::rand({32});
  }
  {
    auto fork = tracker.fork();  // the stream continues: another draw
    v1 = at::rand({32});
  }
  EXPECT_FALSE(at::equal(u1, v1));
  tracker.set_states(saved);  // back to the checkpoint
  {
    auto fork = tracker.fork();
    u2 = at::rand({32});
  }
  {
    auto fork = tracker.fork();
    v2 = at::rand({32});
  }
  EXPECT_TRUE(at::equal(u1, u2));
  EXPECT_TRUE(at::equal(v1, v2));
  // A state saved is a copy: drawing after get_states does not change it.
  EXPECT_TRUE(at::equal(saved.at("extra"), tracker.get_states().at("extra")));

  EXPECT_THROW(tracker.add("extra", 1), TensorParallelError);     // the name again
  EXPECT_THROW(tracker.add("other", 4242), TensorParallelError);  // the seed again
  EXPECT_THROW((void)tracker.fork("missing"), TensorParallelError);
}

}  // namespace
