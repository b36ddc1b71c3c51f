// A flat buffer laid out anew in its own storage: relay_flat_in_place leaves exactly what
// relay_flat returns as a new tensor (padding zero), for any order, and sets aside only the
// parameters whose old place is overwritten before they move: little when the new order is
// close to the old. (The 16-bit parameters through it at the first backward's end: the
// bucket-order test and the engine oracles.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "dscpp/zero/flat_layout.h"
#include "dscpp/zero/relayout.h"

using dscpp::zero::FlatLayout;

namespace {

// Every element distinct (padding too, so that a padding not zeroed shows).
at::Tensor counting(int64_t n) {
  return at::arange(1, n + 1, at::kFloat);
}

void expect_same_as_relay_flat(const FlatLayout& from, const FlatLayout& to) {
  ASSERT_EQ(from.total, to.total);
  const at::Tensor before = counting(from.total);
  const at::Tensor expected = dscpp::zero::relay_flat(from, to, before);
  at::Tensor t = before.clone();
  const void* storage = t.data_ptr();
  dscpp::zero::relay_flat_in_place(from, to, t);
  EXPECT_EQ(t.data_ptr(), storage);
  EXPECT_TRUE(at::equal(t, expected));
}

}  // namespace

TEST(Relayout, InPlaceMatchesRelayFlatForRandomOrders) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 40);
    std::vector<int64_t> numels(n);
    for (auto& v : numels) v = static_cast<int64_t>(rng() % 50);  // zero-sized ones too
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    // One bucket with padding at its end (the same total in any order), or many buckets of
    // unpadded parameters.
    const bool one_bucket = trial % 2 == 0;
    const int64_t bucket = one_bucket ? 1 << 20 : 1 + static_cast<int64_t>(rng() % 80);
    const int64_t alignment = one_bucket ? 16 : 1;
    const FlatLayout from = FlatLayout::build(numels, 1, bucket, alignment);
    const FlatLayout to = FlatLayout::build(numels, 1, bucket, alignment, {}, {}, order);
    SCOPED_TRACE("trial " + std::to_string(trial));
    expect_same_as_relay_flat(from, to);
  }
}

TEST(Relayout, AnOrderCloseToTheOldSetsAsideOnlyWhatMoves) {
  // 100 parameters of 10 elements; backward made two neighbours ready the other way round.
  const std::vector<int64_t> numels(100, 10);
  std::vector<int> order(100);
  for (int k = 0; k < 100; ++k) order[k] = 99 - k;  // the registration order's guess
  std::swap(order[40], order[41]);
  const FlatLayout from = FlatLayout::build(numels, 1, 1000, 1);
  const FlatLayout to = FlatLayout::build(numels, 1, 1000, 1, {}, {}, order);
  const auto plan = dscpp::zero::plan_in_place(from, to);
  EXPECT_EQ(plan.order.size(), 2u);  // the other 98 stay where they are, untouched
  EXPECT_LE(plan.peak, 20);
  expect_same_as_relay_flat(from, to);
}

TEST(Relayout, AReversedOrderStillComesOutRight) {
  std::vector<int64_t> numels = {7, 1, 30, 12, 5, 9, 16};
  std::vector<int> order(numels.size());
  std::iota(order.begin(), order.end(), 0);  // registration order: the guess reversed
  const FlatLayout from = FlatLayout::build(numels, 1, 1 << 20, 8);
  const FlatLayout to = FlatLayout::build(numels, 1, 1 << 20, 8, {}, {}, order);
  const auto plan = dscpp::zero::plan_in_place(from, to);
  EXPECT_LE(plan.peak, from.total);
  expect_same_as_relay_flat(from, to);
}

TEST(Relayout, EmptyParametersAtAnotherOnesOffsetAreNoBarrier) {
  // An empty parameter takes the offset of the one after it; neither may hide the other from
  // the search for what a placement overwrites.
  for (int trial = 0; trial < 8; ++trial) {
    std::vector<int64_t> numels = {6, 0, 10, 0, 0, 4, 0, 8};
    std::vector<int> order(numels.size());
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 rng(trial);
    std::shuffle(order.begin(), order.end(), rng);
    const FlatLayout from = FlatLayout::build(numels, 1, 1 << 20, 1);
    const FlatLayout to = FlatLayout::build(numels, 1, 1 << 20, 1, {}, {}, order);
    SCOPED_TRACE("trial " + std::to_string(trial));
    expect_same_as_relay_flat(from, to);
  }
}

TEST(Relayout, InPlaceRefusesLayoutsOfAnotherSize) {
  const std::vector<int64_t> numels = {5, 8, 3};
  const FlatLayout from = FlatLayout::build(numels, 1, 8, 4);
  const FlatLayout to = FlatLayout::build(numels, 1, 8, 4, {}, {}, {0, 2, 1});
  ASSERT_NE(from.total, to.total);
  at::Tensor t = counting(from.total);
  EXPECT_THROW(dscpp::zero::relay_flat_in_place(from, to, t), std::exception);
  EXPECT_TRUE(at::equal(t, counting(from.total)));
}
