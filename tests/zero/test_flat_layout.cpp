// FlatLayout: reverse registration order, buckets padded to world * alignment, rank r
// owning chunk r of every bucket, partitions of equal size.
#include <gtest/gtest.h>

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
