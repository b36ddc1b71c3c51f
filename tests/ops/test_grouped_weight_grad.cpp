// The experts' weight gradient written into a gradient destination (ops/grouped_weight_grad.h,
// ops/grad_destination.h): grouped_weight_grad_into against float64 products per group
// (overwriting, accumulating, empty groups, padding rows), and ops::grouped_mm's backward
// writing its weight gradient into a registered destination instead of returning it, summed
// over two backwards as a gradient buffer over micro-batches, against autograd of the loop.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/ops/grad_destination.h"
#include "dscpp/ops/grouped_mm.h"
#include "dscpp/ops/grouped_weight_grad.h"

namespace {

// dw[e] = rows_e^T grad_e in float64, zero for an empty group.
at::Tensor weight_grad_reference(const at::Tensor& rows, const at::Tensor& grad,
                                 const std::vector<int64_t>& counts) {
  at::Tensor dw =
      at::zeros({static_cast<int64_t>(counts.size()), rows.size(1), grad.size(1)}, at::kDouble);
  int64_t o = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    dw[static_cast<int64_t>(e)] = at::matmul(rows.narrow(0, o, counts[e]).t().to(at::kDouble),
                                             grad.narrow(0, o, counts[e]).to(at::kDouble));
    o += counts[e];
  }
  return dw;
}

TEST(GroupedWeightGrad, IntoASlotMatchesTheProductsOfEachGroup) {
  at::manual_seed(3);
  const std::vector<std::vector<int64_t>> cases = {{3, 0, 5, 2}, {0, 7, 0}, {1, 1, 1, 1}};
  for (const auto dtype : {at::kFloat, at::kDouble}) {
    for (const auto& counts : cases) {
      int64_t n = 0;
      for (int64_t c : counts) n += c;
      const int64_t e = static_cast<int64_t>(counts.size());
      // Two padding rows past the counts, which no group may read.
      const at::Tensor rows = at::randn({n + 2, 6}, dtype), grad = at::randn({n + 2, 4}, dtype);
      const at::Tensor want = weight_grad_reference(rows, grad, counts);
      const at::Tensor before = at::randn({e, 6, 4}, dtype);
      for (const bool accumulate : {false, true}) {
        at::Tensor slot = before.clone();
        dscpp::ops::grouped_weight_grad_into(slot, rows, grad, counts, accumulate);
        const at::Tensor expected = accumulate ? want + before.to(at::kDouble) : want;
        EXPECT_TRUE(at::allclose(slot.to(at::kDouble), expected, 1e-5, 1e-5))
            << c10::toString(dtype) << " accumulate " << accumulate << ": max error "
            << (slot.to(at::kDouble) - expected).abs().max().item<double>();
      }
    }
  }
}

TEST(GroupedWeightGrad, RefusesCountsAndShapesThatDoNotFit) {
  at::Tensor slot = at::zeros({2, 3, 4});
  const at::Tensor rows = at::randn({5, 3}), grad = at::randn({5, 4});
  EXPECT_THROW(dscpp::ops::grouped_weight_grad_into(slot, rows, grad, {3, 3}, false),
               dscpp::Error);  // more rows than there are
  EXPECT_THROW(dscpp::ops::grouped_weight_grad_into(slot, rows, grad, {6, -1}, false),
               dscpp::Error);  // a negative count
  EXPECT_THROW(dscpp::ops::grouped_weight_grad_into(slot, rows, grad, {1, 1, 1}, false),
               dscpp::Error);  // three counts for two experts
  EXPECT_THROW(dscpp::ops::grouped_weight_grad_into(slot, at::randn({5, 2}), grad, {2, 2}, false),
               dscpp::Error);  // rows of another width
  EXPECT_THROW(
      dscpp::ops::grouped_weight_grad_into(slot, rows.to(at::kDouble), grad, {2, 2}, false),
      dscpp::Error);  // another dtype
}

// A gradient buffer as ZeRO's buckets keep one: the first backward overwrites the slot, later
// ones add to it.
struct Buffer {
  at::Tensor slot;
  bool dirty = false;
  int writes = 0;
};

std::shared_ptr<void> register_buffer(const at::Tensor& weights, Buffer& b) {
  dscpp::ops::GradDestination d;
  d.slot = [&b](bool& accumulate) {
    accumulate = b.dirty;
    return b.slot;
  };
  d.written = [&b] {
    b.dirty = true;
    ++b.writes;
  };
  return dscpp::ops::register_grad_destinations({weights}, {d});
}

TEST(GroupedMm, WritesItsWeightGradientIntoItsDestination) {
  at::manual_seed(11);
  const std::vector<int64_t> counts = {4, 0, 3, 5};
  const at::Tensor c = at::tensor(counts, at::kLong);
  // fp32 aligned (ATen's grouped path) and float64 (the loop): both write there.
  for (const auto dtype : {at::kFloat, at::kDouble}) {
    const at::Tensor weights = at::randn({4, 8, 4}, dtype).requires_grad_(true);
    Buffer buffer;
    buffer.slot = at::full({4, 8, 4}, 7.0, dtype);  // stale: the first backward overwrites it
    const auto handle = register_buffer(weights, buffer);
    at::Tensor want = at::zeros({4, 8, 4}, at::kDouble);
    for (int micro = 0; micro < 2; ++micro) {
      const at::Tensor rows = at::randn({12, 8}, dtype).requires_grad_(true);
      const at::Tensor grad = at::randn({12, 4}, dtype);
      const at::Tensor y = dscpp::ops::grouped_mm(rows, weights, c);
      y.backward(grad);
      want += weight_grad_reference(rows.detach(), grad, counts);
      // d_rows still comes back through autograd: the loop's gradient.
      at::Tensor want_rows = at::zeros({12, 8}, at::kDouble);
      int64_t o = 0;
      for (size_t e = 0; e < counts.size(); ++e) {
        want_rows.narrow(0, o, counts[e]) = at::matmul(grad.narrow(0, o, counts[e]).to(at::kDouble),
                                                       weights[e].detach().t().to(at::kDouble));
        o += counts[e];
      }
      EXPECT_TRUE(at::allclose(rows.grad().to(at::kDouble), want_rows, 1e-5, 1e-5));
    }
    EXPECT_FALSE(weights.grad().defined()) << "the gradient went to autograd as well";
    EXPECT_EQ(buffer.writes, 2);
    EXPECT_TRUE(at::allclose(buffer.slot.to(at::kDouble), want, 1e-5, 1e-5))
        << c10::toString(dtype) << ": max error "
        << (buffer.slot.to(at::kDouble) - want).abs().max().item<double>();
  }
}

TEST(GroupedMm, ReturnsItsWeightGradientWhereTheDestinationHasNoSlot) {
  at::manual_seed(12);
  const std::vector<int64_t> counts = {2, 3};
  const at::Tensor weights = at::randn({2, 8, 4}).requires_grad_(true);
  Buffer buffer;  // an undefined slot: no destination this time (a released stage-3 bucket)
  const auto handle = register_buffer(weights, buffer);
  const at::Tensor rows = at::randn({5, 8}), grad = at::randn({5, 4});
  dscpp::ops::grouped_mm(rows, weights, at::tensor(counts, at::kLong)).backward(grad);
  ASSERT_TRUE(weights.grad().defined());
  EXPECT_EQ(buffer.writes, 0);
  EXPECT_TRUE(at::allclose(weights.grad().to(at::kDouble),
                           weight_grad_reference(rows, grad, counts), 1e-5, 1e-5));
}

// The process setting (train_gpt's --grouped-wgrad): "off" returns the gradient to autograd even
// where the destination has a slot; an unknown name is refused by name.
TEST(GroupedMm, ModeOffReturnsItsWeightGradientToAutograd) {
  at::manual_seed(13);
  const std::vector<int64_t> counts = {3, 2};
  const at::Tensor weights = at::randn({2, 8, 4}).requires_grad_(true);
  Buffer buffer;
  buffer.slot = at::zeros({2, 8, 4});
  const auto handle = register_buffer(weights, buffer);
  const at::Tensor rows = at::randn({5, 8}), grad = at::randn({5, 4});
  dscpp::ops::set_grouped_weight_grad_mode(dscpp::ops::parse_grouped_weight_grad_mode("off"));
  dscpp::ops::grouped_mm(rows, weights, at::tensor(counts, at::kLong)).backward(grad);
  dscpp::ops::set_grouped_weight_grad_mode(dscpp::ops::parse_grouped_weight_grad_mode("auto"));
  EXPECT_EQ(buffer.writes, 0);
  ASSERT_TRUE(weights.grad().defined());
  EXPECT_TRUE(at::allclose(weights.grad().to(at::kDouble),
                           weight_grad_reference(rows, grad, counts), 1e-5, 1e-5));
  try {
    (void)dscpp::ops::parse_grouped_weight_grad_mode("fast");
    ADD_FAILURE() << "'fast' was accepted";
  } catch (const dscpp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fast'"), std::string::npos) << e.what();
  }
}

}  // namespace
