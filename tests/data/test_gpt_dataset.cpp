// GPTDataset and BatchPlan: windows on a hand-checkable stream, windows that tile the shuffled
// stream exactly, seeded determinism, and data-parallel shares that are disjoint and together
// make up the epoch (and each global batch).
#include "dscpp/data/gpt_dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <vector>

#include "tests/data/data_test_util.h"

namespace {

using namespace dscpp::data;
using dscpp::data::testing::numbered_documents;
using dscpp::data::testing::TempDir;
using dscpp::data::testing::write_documents;
using Tokens = std::vector<int64_t>;

std::shared_ptr<const IndexedDataset> open(const std::string& prefix) {
  return std::make_shared<const IndexedDataset>(prefix);
}

Tokens window(const EpochIndex& e, int64_t j) {
  Tokens t(static_cast<size_t>(e.seq_length() + 1));
  e.read_window(j, t.data());
  return t;
}

Tokens sample(const EpochIndex& e, int64_t k) {
  Tokens t(static_cast<size_t>(e.seq_length() + 1));
  e.read_sample(k, t.data());
  return t;
}

bool is_permutation_of_range(const std::vector<int64_t>& v) {
  std::vector<int64_t> s = v;
  std::sort(s.begin(), s.end());
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] != static_cast<int64_t>(i)) return false;
  return true;
}

TEST(GPTDataset, WindowsOfTheStreamInFileOrderByHand) {
  TempDir dir;
  // Stream 1..10 across five documents (one empty); seq_length 3: windows of 4 tokens, each
  // starting on the last token of the one before; (10 - 1) / 3 = 3 windows, none left over.
  auto data = open(write_documents(dir / "d", {{1, 2, 3}, {4, 5}, {}, {6, 7, 8, 9}, {10}}));
  GPTDataset ds(data, {3, 1234, /*shuffle=*/false});
  ASSERT_EQ(ds.samples_per_epoch(), 3);
  EpochIndex e = ds.epoch(0);
  EXPECT_EQ(window(e, 0), (Tokens{1, 2, 3, 4}));
  EXPECT_EQ(window(e, 1), (Tokens{4, 5, 6, 7}));
  EXPECT_EQ(window(e, 2), (Tokens{7, 8, 9, 10}));
  EXPECT_EQ(e.sample_order(), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(sample(e, 1), window(e, 1));
  EXPECT_THROW(window(e, 3), std::runtime_error);

  // seq_length 4: (10 - 1) / 4 = 2 windows; token 10 is unused this epoch.
  GPTDataset ds4(data, {4, 1234, false});
  EpochIndex e4 = ds4.epoch(0);
  ASSERT_EQ(e4.num_samples(), 2);
  EXPECT_EQ(window(e4, 0), (Tokens{1, 2, 3, 4, 5}));
  EXPECT_EQ(window(e4, 1), (Tokens{5, 6, 7, 8, 9}));
}

TEST(GPTDataset, ShuffledWindowsTileTheShuffledStreamExactly) {
  TempDir dir;
  auto docs = numbered_documents(60);
  auto data = open(write_documents(dir / "d", docs));
  GPTDataset ds(data, {16, 99, true});
  for (int64_t epoch : {0, 1}) {
    EpochIndex e = ds.epoch(epoch);
    ASSERT_EQ(e.document_order().size(), docs.size());
    EXPECT_TRUE(is_permutation_of_range(e.document_order()));
    EXPECT_TRUE(is_permutation_of_range(e.sample_order()));
    Tokens stream;  // the documents in the epoch's order, built here from the originals
    for (int64_t d : e.document_order())
      stream.insert(stream.end(), docs[static_cast<size_t>(d)].begin(),
                    docs[static_cast<size_t>(d)].end());
    ASSERT_EQ(ds.samples_per_epoch(), (static_cast<int64_t>(stream.size()) - 1) / 16);
    Tokens rebuilt;  // window j minus the token it shares with window j - 1
    for (int64_t j = 0; j < e.num_samples(); ++j) {
      Tokens w = window(e, j);
      EXPECT_TRUE(std::equal(w.begin(), w.end(), stream.begin() + j * 16)) << "window " << j;
      rebuilt.insert(rebuilt.end(), w.begin() + (j == 0 ? 0 : 1), w.end());
    }
    EXPECT_TRUE(std::equal(rebuilt.begin(), rebuilt.end(), stream.begin()));
    EXPECT_EQ(static_cast<int64_t>(rebuilt.size()), e.num_samples() * 16 + 1);
    EXPECT_LT(static_cast<int64_t>(stream.size() - rebuilt.size()), 16);
    for (int64_t k = 0; k < e.num_samples(); ++k)
      EXPECT_EQ(sample(e, k), window(e, e.sample_order()[static_cast<size_t>(k)]));
  }
}

TEST(GPTDataset, OrdersAreDeterminedBySeedAndEpoch) {
  TempDir dir;
  auto data = open(write_documents(dir / "d", numbered_documents(80)));
  GPTDataset a(data, {8, 7, true}), b(data, {8, 7, true}), c(data, {8, 8, true});
  EpochIndex a0 = a.epoch(0), b0 = b.epoch(0), c0 = c.epoch(0), a1 = a.epoch(1);
  EXPECT_EQ(a0.document_order(), b0.document_order());
  EXPECT_EQ(a0.sample_order(), b0.sample_order());
  EXPECT_NE(a0.document_order(), c0.document_order());
  EXPECT_NE(a0.sample_order(), c0.sample_order());
  EXPECT_NE(a0.document_order(), a1.document_order());
  EXPECT_NE(a0.sample_order(), a1.sample_order());
  std::vector<int64_t> identity(a0.document_order().size());
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(a0.document_order(), identity);
}

TEST(GPTDataset, SeededPermutationIsUniform) {
  std::map<std::vector<int64_t>, int> counts;
  for (uint64_t seed = 0; seed < 6000; ++seed) ++counts[seeded_permutation(3, seed)];
  ASSERT_EQ(counts.size(), 6u);
  for (const auto& [perm, n] : counts) EXPECT_NEAR(n, 1000, 150);  // > 5 standard deviations
  EXPECT_EQ(seeded_permutation(0, 1).size(), 0u);
  EXPECT_EQ(seeded_permutation(1, 1), (std::vector<int64_t>{0}));
}

TEST(BatchPlan, RankSharesAreDisjointAndTogetherCoverTheEpoch) {
  TempDir dir;
  auto data = open(write_documents(dir / "d", numbered_documents(70)));
  GPTDataset ds(data, {8, 3, true});
  EpochIndex e = ds.epoch(0);
  const int64_t n = e.num_samples(), mb = 2;
  for (int64_t world : {1, 2, 3, 4}) {
    SCOPED_TRACE("world " + std::to_string(world));
    std::vector<int> owner(static_cast<size_t>(n), -1);
    int64_t batches = -1;
    for (int64_t rank = 0; rank < world; ++rank) {
      BatchPlan plan{mb, rank, world};
      if (batches >= 0) {
        EXPECT_EQ(plan.batches(n), batches) << "every rank as many batches";
      }
      batches = plan.batches(n);
      EXPECT_EQ(batches, n / world / mb);
      for (int64_t b = 0; b < batches; ++b)
        for (int64_t row = 0; row < mb; ++row) {
          int64_t pos = plan.position(b, row);
          ASSERT_LT(pos, n);
          EXPECT_EQ(owner[static_cast<size_t>(pos)], -1) << "position " << pos << " twice";
          owner[static_cast<size_t>(pos)] = static_cast<int>(rank);
          EXPECT_EQ(pos % world, rank);  // rank r takes every W-th sample, from r
        }
    }
    // Covered: the first batches * mb * world positions; only the remainder is left.
    int64_t covered = std::count_if(owner.begin(), owner.end(), [](int o) { return o >= 0; });
    EXPECT_EQ(covered, batches * mb * world);
    for (int64_t p = 0; p < covered; ++p) EXPECT_GE(owner[static_cast<size_t>(p)], 0);
    EXPECT_LT(n - covered, mb * world);
  }
}

TEST(BatchPlan, GlobalBatchIsWhatOneRankWithAWiderBatchReads) {
  TempDir dir;
  auto data = open(write_documents(dir / "d", numbered_documents(50)));
  GPTDataset ds(data, {6, 11, true});
  EpochIndex e = ds.epoch(2);
  const int64_t world = 4, mb = 3, row = 7;
  BatchPlan single{mb * world, 0, 1};
  for (int64_t b = 0; b < single.batches(e.num_samples()); ++b) {
    Tokens one(static_cast<size_t>(mb * world * row));
    read_batch(e, single, b, one.data());
    std::multiset<Tokens> want, got;
    for (int64_t r = 0; r < mb * world; ++r)
      want.insert(Tokens(one.begin() + r * row, one.begin() + (r + 1) * row));
    for (int64_t rank = 0; rank < world; ++rank) {
      BatchPlan plan{mb, rank, world};
      Tokens part(static_cast<size_t>(mb * row));
      read_batch(e, plan, b, part.data());
      for (int64_t r = 0; r < mb; ++r) {
        Tokens t(part.begin() + r * row, part.begin() + (r + 1) * row);
        EXPECT_EQ(t, sample(e, plan.position(b, r)));
        got.insert(t);
      }
    }
    EXPECT_EQ(got, want) << "global batch " << b;
  }
}

TEST(GPTDataset, RefusesTooLittleDataAndBadPlans) {
  TempDir dir;
  auto data = open(write_documents(dir / "d", {{1, 2, 3}}));
  EXPECT_THROW(GPTDataset(data, {3, 1, true}), std::runtime_error);  // 3 tokens < 4
  EXPECT_NO_THROW(GPTDataset(data, {2, 1, true}));
  EXPECT_THROW(GPTDataset(data, {0, 1, true}), std::runtime_error);
  EXPECT_THROW((BatchPlan{1, 2, 2}.check()), std::runtime_error);
  EXPECT_THROW((BatchPlan{0, 0, 1}.check()), std::runtime_error);
}

}  // namespace
