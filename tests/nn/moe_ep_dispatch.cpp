// Expert-parallel dispatch and combine (nn/moe/expert_parallel_dispatch.h) on real Gloo
// ranks, against one rank computing every expert. Each rank of the world makes its own routed
// rows (expert-major, uneven, with an expert no rank routes to and a rank that routes
// nothing), the local experts are per-expert linears run by ops::grouped_mm; then output,
// d_rows and the experts' weight gradients must equal the one-rank loop over all experts
// (float64), and after the expert-data-parallel all-reduce the weight gradients equal those of
// the whole world's batch. Every expert-parallel degree that divides the world runs (4 ranks:
// ep 2 and 4), with a model axis too when the world has 8 ranks (tensor 2).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <iostream>

#include "dscpp/comm/expert_groups.h"
#include "dscpp/comm/rendezvous.h"
#include "dscpp/nn/moe/expert_parallel_dispatch.h"
#include "dscpp/ops/grouped_mm.h"

using dscpp::comm::ProcessGroup;
namespace moe = dscpp::nn::moe;

namespace {

std::shared_ptr<ProcessGroup> world;

struct Layout {
  int tensor, ep;
};

// Rank g's counts for E experts: expert 1 empty everywhere, rank 3 routes nothing.
std::vector<int64_t> counts_of(int g, int64_t experts) {
  std::vector<int64_t> c(experts);
  for (int64_t e = 0; e < experts; ++e) c[e] = (g == 3 || e == 1) ? 0 : (g + 2 * e) % 4 + (e == 0);
  return c;
}

at::Tensor seeded_randn(at::IntArrayRef sizes, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  return at::randn(sizes, gen, at::TensorOptions().dtype(at::kFloat));
}

int64_t total(const std::vector<int64_t>& c) {
  int64_t s = 0;
  for (int64_t x : c) s += x;
  return s;
}

// One rank's rows through the experts it routes to, in float64: output, d_rows, and its
// contribution to every expert's weight gradient.
struct Reference {
  at::Tensor out, d_rows, d_weights;
};
Reference one_rank(const at::Tensor& rows, const at::Tensor& grad, const at::Tensor& weights,
                   const std::vector<int64_t>& counts) {
  at::Tensor r = rows.to(at::kDouble), g = grad.to(at::kDouble), w = weights.to(at::kDouble);
  Reference ref{at::zeros({r.size(0), w.size(2)}, r.options()), at::zeros_like(r),
                at::zeros_like(w)};
  int64_t o = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    auto re = r.narrow(0, o, counts[e]), ge = g.narrow(0, o, counts[e]);
    ref.out.narrow(0, o, counts[e]).copy_(at::mm(re, w[e]));
    ref.d_rows.narrow(0, o, counts[e]).copy_(at::mm(ge, w[e].t()));
    ref.d_weights[e].copy_(at::mm(re.t(), ge));
    o += counts[e];
  }
  return ref;
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  EXPECT_TRUE(at::allclose(got.to(at::kDouble), want, 1e-6, 1e-6))
      << what << ": max error " << (got.to(at::kDouble) - want).abs().max().item<double>();
}

void run_layout(const Layout& l, int64_t width_in, int64_t width_out) {
  const int n = world->size(), me = world->rank();
  const int data = n / l.tensor;
  dscpp::comm::Topology topo({"data", "model"}, {data, l.tensor});
  auto groups = dscpp::comm::new_expert_groups(*world, topo, l.ep);
  ASSERT_TRUE(groups.expert_parallel && groups.expert_data_parallel);
  ASSERT_EQ(groups.expert_parallel->size(), l.ep);
  const int64_t local = 2, experts = local * l.ep;
  const int ep_rank = groups.expert_parallel->rank();
  SCOPED_TRACE(::testing::Message() << "tensor " << l.tensor << " ep " << l.ep << " widths "
                                    << width_in << "->" << width_out << " rank " << me);

  at::Tensor all_weights = seeded_randn({experts, width_in, width_out}, 1);
  at::Tensor w_local = all_weights.narrow(0, ep_rank * local, local).clone().requires_grad_(true);
  auto counts = counts_of(me, experts);
  at::Tensor rows = seeded_randn({total(counts), width_in}, 100 + me).requires_grad_(true);
  at::Tensor grad = seeded_randn({total(counts), width_out}, 200 + me);

  auto d =
      moe::expert_parallel_dispatch(rows, at::tensor(counts, at::kLong), groups.expert_parallel);
  // What arrived: from each source rank of the group, its rows of this rank's experts.
  std::vector<int64_t> want_local(local, 0);
  for (int i = 0; i < l.ep; ++i) {
    auto src = counts_of(groups.expert_parallel->global_rank(i), experts);
    for (int64_t e = 0; e < local; ++e) {
      EXPECT_EQ(d.by_source[i * local + e], src[ep_rank * local + e]);
      want_local[e] += src[ep_rank * local + e];
    }
  }
  EXPECT_TRUE(at::equal(d.local_counts, at::tensor(want_local, at::kLong)));
  at::Tensor y = dscpp::ops::grouped_mm(d.rows, w_local, d.local_counts);
  at::Tensor out = moe::expert_parallel_combine(y, d, groups.expert_parallel);
  auto g = torch::autograd::grad({out}, {rows, w_local}, {grad});

  Reference mine = one_rank(rows.detach(), grad, all_weights, counts);
  expect_close(out, mine.out, "output");
  expect_close(g[0], mine.d_rows, "d_rows");
  // The experts' weight gradient: every rank of the expert group's tokens ...
  at::Tensor want_dw = at::zeros({local, width_in, width_out}, at::kDouble);
  at::Tensor world_dw = at::zeros_like(want_dw);
  std::vector<int> data_group;  // the ranks whose batch the expert-data reduction covers
  for (const auto& ranks : topo.get_axis_comm_lists("data"))
    if (std::find(ranks.begin(), ranks.end(), me) != ranks.end()) data_group = ranks;
  for (int s : data_group) {
    auto c = counts_of(s, experts);
    Reference ref = one_rank(seeded_randn({total(c), width_in}, 100 + s),
                             seeded_randn({total(c), width_out}, 200 + s), all_weights, c);
    at::Tensor part = ref.d_weights.narrow(0, ep_rank * local, local);
    world_dw += part;
    for (int i = 0; i < l.ep; ++i)
      if (groups.expert_parallel->global_rank(i) == s) want_dw += part;
  }
  expect_close(g[1], want_dw, "d_weights over the expert group");
  // ... and, reduced over the expert-data group, the whole data group's batch, as one rank
  // that holds every expert computes it.
  at::Tensor dw = g[1].contiguous();
  groups.expert_data_parallel->all_reduce(dw).wait();
  expect_close(dw, world_dw, "d_weights over the data group");
}

TEST(ExpertParallelDispatch, EqualsOneRankComputingEveryExpert) {
  const int n = world->size();
  std::vector<Layout> layouts;
  for (int ep = 2; ep <= n; ep *= 2)
    if (n % ep == 0) layouts.push_back({1, ep});
  if (n == 8) layouts.push_back({2, 2}), layouts.push_back({2, 4});
  for (const auto& l : layouts) {
    run_layout(l, 8, 4);  // aligned: ATen's grouped product
    run_layout(l, 3, 5);  // unaligned: the loop
  }
}

TEST(ExpertParallelDispatch, RefusesCountsThatDoNotFitTheGroup) {
  at::Tensor rows = at::zeros({3, 4});
  EXPECT_THROW(moe::expert_parallel_dispatch(rows, at::tensor({1, 1, 1}, at::kLong), world),
               moe::ExpertParallelError);  // 3 experts over the world: not a multiple
  std::vector<int64_t> c(2 * world->size(), 0);
  c[0] = 4;
  EXPECT_THROW(moe::expert_parallel_dispatch(rows, at::tensor(c, at::kLong), world),
               moe::ExpertParallelError);  // sums to 4, more than the 3 rows (fewer: padding)
  c[0] = 2;
  c[1] = -1;
  EXPECT_THROW(moe::expert_parallel_dispatch(rows, at::tensor(c, at::kLong), world),
               moe::ExpertParallelError);  // a negative count
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  dscpp::comm::InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(60);
  world = dscpp::comm::init_distributed(options);
  std::cout << "moe_ep_dispatch: rank " << world->rank() << " of " << world->size() << "\n";
  const int rc = RUN_ALL_TESTS();
  world->barrier().wait();
  world.reset();
  return rc;
}
