// Parameters that get a gradient on some ranks only (zero/grad_buckets.h): they count as zero
// gradients, and no difference in which parameters got one where can hang or mis-pair a
// collective. Run by the launcher on 2 and 4 Gloo ranks. A three-layer model whose middle
// layer's scale a1 is used on every other rank only (alternating each micro-step), so a1's
// bucket is complete during backward on some ranks and only at the end on the others:
//   - CrossGroup: a collective of another group in backward below a1's layer (as the MoE
//     layer's all-to-all, or a tensor-parallel reduction): a rank that waited for a1's
//     reduction inside backward (stage 0-2 without overlap_comm used to) never reached it
//     while its peers waited there. Stages 0-3 (3 gathered whole), with and without
//     overlap_comm, accumulation 1 and 2.
//   - LayerGathers: stage 3 by layer, where the layer gathers share the data group with the
//     reduce-scatters during backward: a1's bucket must go before layer 0's gather on every
//     rank (units_complete_above), or one rank's reduce-scatter meets another's all-gather.
// In each, three SGD steps equal a float64 reference of the same rule on the global batch
// (within 1e-5): each rank's gradient averaged over the ranks, a1's counting zero where unused.
// The group's timeout is 30 s, so a regression fails there instead of hanging.
#include "dscpp/ops/autograd_function.h"  // first: see there

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "dscpp/comm/rendezvous.h"
#include "dscpp/optim/optimizer.h"
#include "dscpp/zero/layer_gather.h"
#include "dscpp/zero/zero_optimizer.h"

namespace {

std::shared_ptr<dscpp::comm::ProcessGroup> world, other;  // other: all ranks, a second group

constexpr int kSteps = 3;
constexpr double kLr = 0.1;

// Identity forward; backward all-reduces a copy of the gradient over `other` (the result is
// not used: what matters is a blocking collective of another group inside backward).
struct CollectiveInBackward : torch::autograd::Function<CollectiveInBackward> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) {
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    at::Tensor copy = grads[0].detach().clone();
    other->all_reduce(copy).wait();
    return {grads[0]};
  }
};

// Registered w0, w1, a1, w2; used in layers 0 (w0), 1 (w1, a1 where `uses_a1`), 2 (w2).
struct Net {
  at::Tensor w0, w1, a1, w2;
  std::vector<at::Tensor> params() const { return {w0, w1, a1, w2}; }
};

Net make_net(at::ScalarType dtype) {
  auto gen = at::detail::createCPUGenerator(5);
  auto draw = [&](at::IntArrayRef s) {
    return at::randn(s, gen, at::TensorOptions().dtype(at::kDouble)).mul(0.5).to(dtype);
  };
  Net n{draw({4, 4}), draw({4, 4}), draw({4}).add(1.0), draw({4, 4})};
  for (auto& p : n.params()) p.set_requires_grad(true);
  return n;
}

// Around each layer (stage 3 by layer); no-ops otherwise.
struct Hooks {
  dscpp::zero::LayerGather* gather = nullptr;
  void before(int l) const {
    if (gather) gather->before_forward(l);
  }
  at::Tensor after(int l, const at::Tensor& out) const {
    return gather ? gather->after_forward(l, out) : out;
  }
};

at::Tensor loss_of(const Net& n, const at::Tensor& x, bool uses_a1, bool collective,
                   const Hooks& hooks = {}) {
  hooks.before(0);
  at::Tensor h = hooks.after(0, at::tanh(at::matmul(x, n.w0.t())));
  if (collective) h = CollectiveInBackward::apply(h);
  hooks.before(1);
  h = at::tanh(at::matmul(h, n.w1.t()));
  if (uses_a1) h = h * n.a1;
  h = hooks.after(1, h);
  hooks.before(2);
  return hooks.after(2, at::matmul(h, n.w2.t())).pow(2).mean();
}

// Rank r's rows of micro-step k's global batch, and whether it uses a1 there.
at::Tensor rows(int k, int rank, at::ScalarType dtype) {
  auto gen = at::detail::createCPUGenerator(200 + k);
  at::Tensor all = at::randn({3 * world->size(), 4}, gen, at::TensorOptions().dtype(at::kDouble));
  return all.slice(0, 3 * rank, 3 * rank + 3).to(dtype);
}
bool uses_a1(int k, int rank) {
  return (rank + k) % 2 == 0;
}

std::unique_ptr<dscpp::optim::Optimizer> sgd() {
  dscpp::OptimizerConfig c;
  c.type = "sgd";
  c.params = {{"lr", kLr}};
  return dscpp::optim::make_optimizer(c);
}

struct Case {
  int stage;
  bool overlap;
  int accumulation;
  bool by_layer;  // stage 3 through LayerGather (no prefetch, layers re-gathered for backward)
};

std::string name(const Case& c) {
  return "stage " + std::to_string(c.stage) + (c.by_layer ? " by layer" : "") +
         (c.overlap ? " overlap" : "") + " ga " + std::to_string(c.accumulation) + " on " +
         std::to_string(world->size()) + " ranks";
}

// The weights after kSteps steps through ZeroOptimizer.
std::vector<at::Tensor> train(const Case& c) {
  Net net = make_net(at::kFloat);
  dscpp::zero::ZeroOptions o;
  o.stage = c.stage;
  o.overlap_comm = c.overlap;
  o.reduce_bucket_size = 1;  // a bucket per parameter
  o.alignment = 1;
  if (c.by_layer) o.unit_of = {0, 1, 1, 2};
  dscpp::zero::ZeroOptimizer zo(net.params(), sgd(), world, o);
  std::unique_ptr<dscpp::zero::LayerGather> gather;
  Hooks hooks;
  if (c.by_layer) {
    std::vector<std::vector<int>> layer_buckets(3);
    const int unit_of[] = {0, 1, 1, 2};
    for (int i = 0; i < 4; ++i) layer_buckets[unit_of[i]].push_back(zo.layout().params[i].bucket);
    dscpp::zero::LayerGatherOptions lo;
    lo.prefetch_bucket_size = 0;  // every gather at its layer: the order is exact
    lo.max_reuse_distance = 0;
    gather = std::make_unique<dscpp::zero::LayerGather>(zo, layer_buckets, lo);
    hooks.gather = gather.get();
  }
  const int r = world->rank();
  int k = 0;
  for (int s = 0; s < kSteps; ++s) {
    for (int m = 0; m < c.accumulation; ++m, ++k) {
      const bool reduce = c.stage >= 2 || m == c.accumulation - 1;
      zo.begin_backward(reduce);
      if (!c.by_layer) zo.gather();
      at::Tensor loss = loss_of(net, rows(k, r, at::kFloat), uses_a1(k, r), !c.by_layer, hooks);
      (loss / c.accumulation).backward();
      zo.end_backward();
      if (gather) gather->end_step();
      zo.release();
    }
    EXPECT_TRUE(zo.step(1.0).applied) << name(c);
  }
  zo.gather();
  std::vector<at::Tensor> out;
  for (const auto& p : net.params()) out.push_back(p.detach().to(at::kDouble).clone());
  zo.release();
  return out;
}

// The same rule in float64 on the whole global batch, every rank's loss at once.
std::vector<at::Tensor> reference(const Case& c) {
  Net net = make_net(at::kDouble);
  const int n = world->size();
  int k = 0;
  for (int s = 0; s < kSteps; ++s) {
    at::Tensor loss = at::zeros({}, at::kDouble);
    for (int m = 0; m < c.accumulation; ++m, ++k)
      for (int q = 0; q < n; ++q)
        loss = loss +
               loss_of(net, rows(k, q, at::kDouble), uses_a1(k, q), false) / (c.accumulation * n);
    loss.backward();
    at::NoGradGuard no_grad;
    for (auto& p : net.params()) {
      p.sub_(p.grad() * kLr);
      p.mutable_grad().reset();
    }
  }
  std::vector<at::Tensor> out;
  for (const auto& p : net.params()) out.push_back(p.detach().clone());
  return out;
}

class UnusedGradients : public ::testing::TestWithParam<Case> {};

TEST_P(UnusedGradients, TrainAsTheReferenceWithoutHanging) {
  const Case c = GetParam();
  const auto got = train(c);
  const auto want = reference(c);
  const char* names[] = {"w0", "w1", "a1", "w2"};
  for (size_t i = 0; i < want.size(); ++i) {
    const double scale = want[i].abs().max().item<double>();
    EXPECT_LE((got[i] - want[i]).abs().max().item<double>() / scale, 1e-5)
        << name(c) << ": " << names[i];
  }
  // a1 moved: the ranks that used it gave it a gradient.
  const Net start = make_net(at::kDouble);
  EXPECT_GT((want[2] - start.a1.detach()).abs().max().item<double>(), 1e-3) << name(c);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return "Stage" + std::to_string(c.stage) + (c.overlap ? "Overlap" : "") + "Ga" +
         std::to_string(c.accumulation);
}

INSTANTIATE_TEST_SUITE_P(CrossGroup, UnusedGradients,
                         ::testing::Values(Case{0, false, 1, false}, Case{0, true, 1, false},
                                           Case{0, false, 2, false}, Case{1, false, 1, false},
                                           Case{1, true, 2, false}, Case{2, false, 1, false},
                                           Case{2, true, 1, false}, Case{3, false, 1, false},
                                           Case{3, true, 1, false}),
                         case_name);
INSTANTIATE_TEST_SUITE_P(LayerGathers, UnusedGradients,
                         ::testing::Values(Case{3, false, 1, true}, Case{3, true, 1, true}),
                         case_name);

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  dscpp::comm::InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(30);
  world = dscpp::comm::init_distributed(options);
  std::vector<int> all(world->size());
  for (int r = 0; r < world->size(); ++r) all[r] = r;
  other = world->new_subgroup(all, "other");
  const int rc = RUN_ALL_TESTS();
  world->barrier().wait();
  other.reset();
  world.reset();
  return rc;
}
