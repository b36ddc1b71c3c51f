// FlatLayout: reverse registration order, buckets padded to world * alignment, rank r
// owning chunk r of every bucket, partitions of equal size.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/zero/flat_layout.h"

using dscpp::zero::FlatLayout;

TEST(FlatLayout, ReverseOrderBucketsAndPadding) {
  // Parameters of 5, 3 and 10 elements; buckets close once they reach 8 elements.
  auto l = FlatLayout::build({5, 3, 10}, 2, 8, 2);
  ASSERT_EQ(l.buckets.size(), 2u);
  // Backward produces the last parameter first: it opens the buffer.
  EXPECT_EQ(l.params[2].offset, 0);
  EXPECT_EQ(l.params[2].bucket, 0);
  EXPECT_EQ(l.buckets[0].begin, 0);
  EXPECT_EQ(l.buckets[0].end, 12);  // 10 rounded up to a multiple of 2 ranks * 2 = 4
  EXPECT_EQ(l.params[1].offset, 12);
  EXPECT_EQ(l.params[0].offset, 15);
  EXPECT_EQ(l.buckets[1].begin, 12);
  EXPECT_EQ(l.buckets[1].end, 20);  // 8 elements, already a multiple of 4
  EXPECT_EQ(l.buckets[0].chunk, 6);
  EXPECT_EQ(l.buckets[1].chunk, 4);
  EXPECT_EQ(l.buckets[1].part_offset, 6);
  EXPECT_EQ(l.partition, 10);
  EXPECT_EQ(l.total, 20);
  EXPECT_EQ(l.total, l.partition * 2);
}

TEST(FlatLayout, OneRankHoldsEverything) {
  auto l = FlatLayout::build({7, 9}, 1, 1000, 1);
  ASSERT_EQ(l.buckets.size(), 1u);
  EXPECT_EQ(l.partition, 16);
  EXPECT_EQ(l.total, 16);
  EXPECT_EQ(l.buckets[0].params, (std::vector<int>{1, 0}));
}

TEST(FlatLayout, EveryElementBelongsToExactlyOneParameterOrPadding) {
  std::vector<int64_t> numels = {3, 17, 1, 64, 5, 5, 29};
  for (int world : {1, 2, 3, 8}) {
    auto l = FlatLayout::build(numels, world, 20, 4);
    std::vector<int> owner(l.total, -1);
    for (size_t i = 0; i < numels.size(); ++i)
      for (int64_t e = 0; e < numels[i]; ++e) {
        ASSERT_EQ(owner[l.params[i].offset + e], -1);
        owner[l.params[i].offset + e] = static_cast<int>(i);
      }
    int64_t part = 0;
    for (const auto& b : l.buckets) {
      EXPECT_EQ((b.end - b.begin) % (world * 4), 0);
      EXPECT_EQ(b.part_offset, part);
      part += b.chunk;
      for (int i : b.params) EXPECT_GE(l.params[i].offset, b.begin);
    }
    EXPECT_EQ(part, l.partition);
    EXPECT_EQ(l.partition * world, l.total);
  }
}

TEST(FlatLayout, UnitsNeverShareABucketAndGoLastLayerFirst) {
  // Layers 0, 0, 1, 1 and a persistent (-1) parameter registered between them; buckets large
  // enough to hold everything, so only the unit boundaries split them.
  auto l = FlatLayout::build({4, 4, 4, 4, 2}, 2, 1000, 1, {}, {0, 0, 1, 1, -1});
  ASSERT_EQ(l.buckets.size(), 3u);
  EXPECT_EQ(l.buckets[0].unit, 1);  // backward reaches layer 1 first
  EXPECT_EQ(l.buckets[1].unit, 0);
  EXPECT_EQ(l.buckets[2].unit, -1);  // persistent parameters last
  EXPECT_EQ(l.buckets[0].params, (std::vector<int>{3, 2}));
  EXPECT_EQ(l.buckets[1].params, (std::vector<int>{1, 0}));
  EXPECT_EQ(l.buckets[2].params, (std::vector<int>{4}));
  EXPECT_EQ(l.params[3].offset, 0);
  EXPECT_EQ(l.params[1].offset, 8);
  EXPECT_EQ(l.total, 18);
  EXPECT_THROW(FlatLayout::build({4, 4}, 2, 8, 1, {}, {0}), dscpp::Error);
}

// Whole parameters (FlatLayout::build_whole), hand-computed: sizes 6, 4, 10, 2 on 2 ranks,
// cost = size. Owners, costliest first to the least loaded rank: 10 -> 0, 6 -> 1, 4 -> 1,
// 2 -> 0 (a tie at 10 each goes to rank 0). In reverse registration order (3, 2, 1, 0), rank 0
// holds 3 then 2 (12 elements) from the start of chunk 0, rank 1 holds 1 then 0 (10) from the
// start of chunk 1; the chunk is the wider share, 12.
TEST(FlatLayoutWhole, EachParameterLiesWholeInItsOwnersChunk) {
  auto l = FlatLayout::build_whole({6, 4, 10, 2}, 2, 100, 2, {6, 4, 10, 2});
  ASSERT_EQ(l.buckets.size(), 1u);
  EXPECT_EQ(l.buckets[0].chunk, 12);
  EXPECT_EQ(l.params[3].offset, 0);
  EXPECT_EQ(l.params[2].offset, 2);
  EXPECT_EQ(l.params[1].offset, 12);
  EXPECT_EQ(l.params[0].offset, 16);
  EXPECT_EQ(l.total, 24);
  EXPECT_EQ(l.partition, 12);
  EXPECT_EQ(l.owner_of(2), 0);
  EXPECT_EQ(l.owner_of(3), 0);
  EXPECT_EQ(l.owner_of(0), 1);
  EXPECT_EQ(l.owner_of(1), 1);
}

// On one rank the whole layout is the flat one.
TEST(FlatLayoutWhole, OnOneRankItIsTheFlatLayout) {
  const std::vector<int64_t> numels = {3, 17, 1, 64, 5, 5, 29};
  const std::vector<double> cost(numels.begin(), numels.end());
  for (int64_t bucket : {8, 20, 1000})
    EXPECT_TRUE(FlatLayout::build_whole(numels, 1, bucket, 4, cost)
                    .same_placement(FlatLayout::build(numels, 1, bucket, 4)));
}

// For any sizes, worlds and bucket sizes: every element belongs to one parameter or to padding,
// every parameter lies in one chunk, that of its owner, groups never share a bucket, and the
// owners' costs are balanced within the longest-processing-time bound (4/3 of the larger of
// the mean load and the costliest parameter).
TEST(FlatLayoutWhole, InvariantsAndBalance) {
  const std::vector<int64_t> numels = {3, 17, 1, 64, 5, 5, 29, 12, 40, 7, 7, 9};
  std::vector<double> cost;
  for (int64_t n : numels) cost.push_back(static_cast<double>(n * n));
  const std::vector<int> groups = {0, 0, 1, 0, 1, 1, 0, 0, 1, 0, 0, 1};
  for (int world : {2, 3, 4, 8})
    for (int64_t bucket : {10, 50, 10000}) {
      SCOPED_TRACE("world " + std::to_string(world) + ", bucket " + std::to_string(bucket));
      auto l = FlatLayout::build_whole(numels, world, bucket, 4, cost, groups);
      std::vector<int> owner(l.total, -1);
      std::vector<double> load(world, 0.0);
      for (size_t i = 0; i < numels.size(); ++i) {
        const auto& p = l.params[i];
        const auto& b = l.buckets[p.bucket];
        const int r = l.owner_of(static_cast<int>(i));
        EXPECT_GE(p.offset, b.begin + r * b.chunk);
        EXPECT_LE(p.offset + p.numel, b.begin + (r + 1) * b.chunk);
        EXPECT_EQ(b.group, groups[i]);
        load[r] += cost[i];
        for (int64_t e = 0; e < p.numel; ++e) {
          ASSERT_EQ(owner[p.offset + e], -1);
          owner[p.offset + e] = static_cast<int>(i);
        }
      }
      int64_t part = 0;
      for (const auto& b : l.buckets) {
        EXPECT_EQ(b.part_offset, part);
        EXPECT_EQ(b.end - b.begin, b.chunk * world);
        EXPECT_EQ(b.chunk % 4, 0);
        part += b.chunk;
      }
      EXPECT_EQ(part, l.partition);
      EXPECT_EQ(l.partition * world, l.total);
      const double total = std::accumulate(cost.begin(), cost.end(), 0.0);
      const double bound =
          4.0 / 3.0 * std::max(total / world, *std::max_element(cost.begin(), cost.end()));
      EXPECT_LE(*std::max_element(load.begin(), load.end()), bound);
    }
}
