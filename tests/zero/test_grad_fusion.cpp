// Gradient accumulation fusion (ops/grad_destination.h): nn::linear writes its weight gradient
// into ZeRO's buckets. Run by the launcher on 1 and 2 Gloo ranks. After one window (a first,
// which lays ZeRO's buffers out and is stepped with lr 0, comes before it) the reduced gradient
// partition equals the float64 reference gradient of the global batch, is
// the same bits as with the fusion off, and the buckets copied only what autograd produced
// (the bias, and the tied weight's other use): the fused weights arrived in place. With
// overlap_comm the buckets are still issued during backward (the ready hooks fire for
// gradients autograd never saw).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "dscpp/comm/rendezvous.h"
#include "dscpp/nn/linear.h"
#include "dscpp/ops/grad_destination.h"
#include "dscpp/optim/optimizer.h"
#include "dscpp/zero/zero_optimizer.h"

namespace {

std::shared_ptr<dscpp::comm::ProcessGroup> world;

// w1 [16, 12] and b1 through nn::linear, w2 [8, 16] without bias; w1 also used outside a
// linear (as a tied weight is), so its gradient comes partly through autograd.
struct Net {
  at::Tensor w1, b1, w2;
  std::vector<at::Tensor> params() const { return {w1, b1, w2}; }
  at::Tensor loss(const at::Tensor& x) const {
    at::Tensor h = at::tanh(dscpp::nn::linear(x, w1, b1));
    at::Tensor y = dscpp::nn::linear(h, w2);
    return y.pow(2).mean() + 0.01 * (w1 * w1).sum();
  }
};

Net make_net(at::ScalarType dtype) {
  auto gen = at::detail::createCPUGenerator(11);
  auto draw = [&](at::IntArrayRef s) {
    return at::randn(s, gen, at::TensorOptions().dtype(at::kDouble)).mul(0.3).to(dtype);
  };
  Net n{draw({16, 12}), draw({16}), draw({8, 16})};
  for (auto& p : n.params()) p.set_requires_grad(true);
  return n;
}

// Rows of every rank's batch: rank r takes rows [r * 4, r * 4 + 4) (micro-step m: its own).
at::Tensor global_batch(int world_size, int micro) {
  auto gen = at::detail::createCPUGenerator(100 + micro);
  return at::randn({4 * world_size, 12}, gen, at::TensorOptions().dtype(at::kDouble));
}

std::unique_ptr<dscpp::optim::Optimizer> sgd() {
  dscpp::OptimizerConfig c;
  c.type = "sgd";
  c.params = {{"lr", 0.1}};
  return dscpp::optim::make_optimizer(c);
}

struct Case {
  int stage;
  bool overlap;
  int accumulation;
  at::ScalarType dtype;
};

struct Result {
  at::Tensor partition;               // this rank's reduced gradients
  std::vector<at::Tensor> reference;  // this rank's chunks of the float64 reference, per bucket
  std::vector<at::Tensor> got;
  int64_t copies = 0;
  int issued = 0;
};

Result run(const Case& c, bool fusion) {
  dscpp::ops::set_gradient_accumulation_fusion(fusion);
  const int n = world->size(), r = world->rank();
  Net net = make_net(c.dtype);
  dscpp::zero::ZeroOptions o;
  o.stage = c.stage;
  o.overlap_comm = c.overlap;
  o.reduce_bucket_size = 64;  // a bucket per parameter or two
  o.grad_dtype = c.dtype == at::kFloat ? at::kFloat : c.dtype;
  dscpp::zero::ZeroOptimizer zo(net.params(), sgd(), world, o);
  Result res;
  for (int window = 0; window < 2; ++window) {
    res.issued = 0;
    res.copies = window == 0 ? 0 : zo.grad_buckets().copies();
    for (int m = 0; m < c.accumulation; ++m) {
      const bool reduce = c.stage >= 2 || m == c.accumulation - 1;
      zo.begin_backward(reduce);
      zo.gather();
      at::Tensor x = global_batch(n, m).slice(0, 4 * r, 4 * r + 4).to(c.dtype);
      // Each rank's mean; ZeRO averages over ranks and the micro-steps add up.
      (net.loss(x) / c.accumulation).backward();
      zo.end_backward();
      zo.release();
      res.issued += zo.buckets_issued_during_backward();
    }
    if (window == 0) {  // (the weights stay as they are: p - 0 g)
      zo.optimizer().set_lr(0.0);
      zo.step(1.0);
    }
  }
  res.copies = zo.grad_buckets().copies() - res.copies;
  res.partition = zo.grad_partition().to(at::kDouble) * zo.grad_buckets().sink().deferred_scale();
  // The float64 reference on the global batch, laid out as the buffer.
  Net ref = make_net(at::kDouble);
  at::Tensor loss = at::zeros({}, at::kDouble);
  for (int m = 0; m < c.accumulation; ++m) {
    at::Tensor xs = global_batch(n, m);
    for (int q = 0; q < n; ++q)
      loss = loss + ref.loss(xs.slice(0, 4 * q, 4 * q + 4)) / (c.accumulation * n);
  }
  loss.backward();
  const auto& layout = zo.layout();
  at::Tensor flat = at::zeros({layout.total}, at::kDouble);
  const auto rp = ref.params();
  for (size_t i = 0; i < rp.size(); ++i)
    flat.slice(0, layout.params[i].offset, layout.params[i].offset + layout.params[i].numel)
        .copy_(rp[i].grad().reshape({-1}));
  const int64_t parts = c.stage >= 1 ? n : 1;
  for (const auto& b : layout.buckets) {
    const int64_t chunk = (b.end - b.begin) / parts;
    const int64_t mine = parts == 1 ? 0 : r;
    res.reference.push_back(flat.slice(0, b.begin + mine * chunk, b.begin + (mine + 1) * chunk));
    res.got.push_back(c.stage >= 1 ? res.partition.slice(0, b.part_offset, b.part_offset + chunk)
                                   : res.partition.slice(0, b.begin, b.end));
  }
  dscpp::ops::set_gradient_accumulation_fusion(true);
  return res;
}

class GradFusion : public ::testing::TestWithParam<Case> {};

TEST_P(GradFusion, GradientsInPlaceAndExact) {
  const Case c = GetParam();
  const Result on = run(c, true);
  const Result off = run(c, false);
  const double tol = c.dtype == at::kFloat ? 1e-5 : 2e-2;
  for (size_t b = 0; b < on.got.size(); ++b) {
    const double scale = on.reference[b].abs().max().item<double>() + 1e-30;
    EXPECT_LE((on.got[b] - on.reference[b]).abs().max().item<double>() / scale, tol)
        << "bucket " << b;
  }
  // The same products, written in place: the same bits as through autograd (one micro-step).
  if (c.accumulation == 1) {
    EXPECT_TRUE(at::equal(on.partition, off.partition));
  }
  if (c.stage >= 2) {
    // Per micro-step, autograd's gradients of b1 and of w1's use outside the linear.
    EXPECT_EQ(on.copies, 2 * c.accumulation);
    EXPECT_EQ(off.copies, 3 * c.accumulation);
  } else {
    EXPECT_EQ(on.copies, 0);
  }
  if (c.overlap) {
    EXPECT_GT(on.issued, 0) << "no bucket issued during backward";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GradFusion,
    ::testing::Values(Case{2, true, 1, at::kFloat}, Case{2, false, 2, at::kFloat},
                      Case{1, true, 2, at::kFloat}, Case{0, false, 1, at::kFloat},
                      Case{2, true, 1, at::kBFloat16}, Case{3, false, 1, at::kFloat}));

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  dscpp::comm::InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(60);
  world = dscpp::comm::init_distributed(options);
  const int rc = RUN_ALL_TESTS();
  world->barrier().wait();
  world.reset();
  return rc;
}
