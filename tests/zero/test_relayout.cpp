// The re-lay's buffer moves: relay_host_through writes into the host buffer itself exactly what
// relay_partition (and relay_flat) return as a new tensor, and refuses, untouched, where the
// new layout has another size. (Several ranks: the offload oracles, whose CPU runs re-lay every
// offloaded buffer through this path with the host as the scratch device.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "dscpp/comm/no_op_group.h"
#include "dscpp/zero/flat_layout.h"
#include "dscpp/zero/relayout.h"

using dscpp::zero::FlatLayout;

namespace {

const c10::Device kCpu(c10::kCPU);

// Every element distinct, so a misplaced one shows.
at::Tensor counting(int64_t n) {
  return at::arange(1, n + 1, at::kFloat);
}

}  // namespace

TEST(Relayout, HostThroughWritesWhatRelayPartitionReturnsOnOneRank) {
  // Sizes that are multiples of the alignment: any order gives the same total.
  const std::vector<int64_t> numels = {8, 4, 12, 16, 4};
  const FlatLayout from = FlatLayout::build(numels, 1, 12, 4);
  const FlatLayout to = FlatLayout::build(numels, 1, 12, 4, {}, {}, {2, 0, 4, 1, 3});
  ASSERT_FALSE(from.same_placement(to));
  ASSERT_EQ(from.partition, to.partition);
  auto group = dscpp::comm::make_no_op_group(0, 1);
  at::Tensor t = counting(from.partition);
  const at::Tensor expected = dscpp::zero::relay_partition(from, to, t, 0, *group, kCpu);
  const void* storage = t.data_ptr();
  ASSERT_TRUE(dscpp::zero::relay_host_through(from, to, t, true, 0, *group, kCpu, kCpu));
  EXPECT_EQ(t.data_ptr(), storage);
  EXPECT_TRUE(at::equal(t, expected));
  // Every parameter's values followed it to its new offset.
  const at::Tensor old = counting(from.partition);
  for (size_t i = 0; i < numels.size(); ++i)
    EXPECT_TRUE(at::equal(t.slice(0, to.params[i].offset, to.params[i].offset + numels[i]),
                          old.slice(0, from.params[i].offset, from.params[i].offset + numels[i])));
}

TEST(Relayout, HostThroughRefusesANewSizeAndLeavesTheBufferAlone) {
  // A 5-element parameter pads its bucket: moved into another bucket, the total changes.
  const std::vector<int64_t> numels = {5, 8, 3};
  const FlatLayout from = FlatLayout::build(numels, 1, 8, 4);
  const FlatLayout to = FlatLayout::build(numels, 1, 8, 4, {}, {}, {0, 2, 1});
  ASSERT_NE(from.total, to.total);
  auto group = dscpp::comm::make_no_op_group(0, 1);
  at::Tensor t = counting(from.total);
  EXPECT_FALSE(dscpp::zero::relay_host_through(from, to, t, false, 0, *group, kCpu, kCpu));
  EXPECT_TRUE(at::equal(t, counting(from.total)));
  // The flat buffer through the allocating path: every parameter's values, padding zero.
  const at::Tensor moved = dscpp::zero::relay_flat(from, to, t);
  ASSERT_EQ(moved.numel(), to.total);
  at::Tensor seen = at::zeros({to.total}, at::kBool);
  for (size_t i = 0; i < numels.size(); ++i) {
    const auto& a = from.params[i];
    const auto& b = to.params[i];
    EXPECT_TRUE(at::equal(moved.slice(0, b.offset, b.offset + b.numel),
                          t.slice(0, a.offset, a.offset + a.numel)));
    seen.slice(0, b.offset, b.offset + b.numel).fill_(true);
  }
  EXPECT_EQ(moved.masked_select(seen.logical_not()).abs().sum().item<double>(), 0.0);
}
