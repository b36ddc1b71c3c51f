// Prefetcher and DataLoader: the background thread delivers exactly what direct reading gives,
// across epochs and ranks, resumes mid-stream, re-throws its errors and shuts down cleanly.
#include "dscpp/data/data_loader.h"

#include <ATen/ops/equal.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include "tests/data/data_test_util.h"

namespace {

using namespace dscpp::data;
using dscpp::data::testing::numbered_documents;
using dscpp::data::testing::TempDir;
using dscpp::data::testing::write_documents;

TEST(Prefetcher, DeliversItemsInOrderThenTheEnd) {
  int next = 0;
  Prefetcher<int> p(
      [&]() -> std::optional<int> {
        if (next == 100) return std::nullopt;
        return next++;
      },
      3);
  for (int k = 0; k < 100; ++k) EXPECT_EQ(p.next(), k);
  EXPECT_EQ(p.next(), std::nullopt);
  EXPECT_EQ(p.next(), std::nullopt);
}

TEST(Prefetcher, RethrowsTheProducersErrorAfterTheItemsBeforeIt) {
  int next = 0;
  Prefetcher<int> p(
      [&]() -> std::optional<int> {
        if (next == 5) throw std::runtime_error("disk on fire");
        return next++;
      },
      2);
  for (int k = 0; k < 5; ++k) EXPECT_EQ(p.next(), k);
  try {
    p.next();
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "disk on fire");
  }
  EXPECT_EQ(p.next(), std::nullopt);  // reported once; then the stream has ended
}

TEST(Prefetcher, StaysBoundedAndStopsAProducerBlockedOnAFullQueue) {
  std::atomic<int> produced{0};
  auto start = std::chrono::steady_clock::now();
  {
    Prefetcher<int> p([&]() -> std::optional<int> { return produced++; }, 4);  // endless
    EXPECT_EQ(p.next(), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_LE(produced.load(), 1 + 4 + 1) << "no more than depth items ahead";
  }  // the thread waits on a full queue here: the destructor must wake and join it
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

struct DataLoaderTest : ::testing::Test {
  TempDir dir;
  std::shared_ptr<const GPTDataset> dataset;
  void SetUp() override {
    auto data =
        std::make_shared<const IndexedDataset>(write_documents(dir / "d", numbered_documents(120)));
    dataset = std::make_shared<const GPTDataset>(data, GPTDatasetOptions{12, 42, true});
  }
  // What the loader must deliver: epoch after epoch of make_batch on this thread.
  std::vector<Batch> direct(const DataLoaderOptions& o, int64_t epochs) {
    BatchPlan plan{o.micro_batch_size, o.rank, o.world_size};
    std::vector<Batch> out;
    for (int64_t e = 0; e < epochs; ++e) {
      EpochIndex index = dataset->epoch(e);
      for (int64_t b = 0; b < plan.batches(index.num_samples()); ++b)
        out.push_back(make_batch(index, plan, b));
    }
    return out;
  }
};

void expect_same(const std::vector<Batch>& got, const std::vector<Batch>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].epoch, want[i].epoch) << i;
    EXPECT_EQ(got[i].index, want[i].index) << i;
    EXPECT_TRUE(at::equal(got[i].tokens, want[i].tokens)) << "batch " << i;
  }
}

TEST_F(DataLoaderTest, PrefetchThreadDeliversTheBatchesOfDirectReading) {
  for (int64_t prefetch : {0, 1, 3}) {
    SCOPED_TRACE("prefetch " + std::to_string(prefetch));
    DataLoaderOptions o;
    o.micro_batch_size = 3;
    o.rank = 1;
    o.world_size = 2;
    o.num_epochs = 2;
    o.prefetch = prefetch;
    DataLoader loader(dataset, o);
    std::vector<Batch> got;
    for (auto& batch : loader) got.push_back(batch);  // the range-for of the design
    auto want = direct(o, 2);
    EXPECT_EQ(static_cast<int64_t>(want.size()), 2 * loader.batches_per_epoch());
    expect_same(got, want);
    EXPECT_EQ(loader.next(), std::nullopt);
  }
}

TEST_F(DataLoaderTest, BatchesAreTokensWithInputAndTargetShiftedByOne) {
  DataLoaderOptions o;
  o.micro_batch_size = 4;
  DataLoader loader(dataset, o);
  auto batch = loader.next();
  ASSERT_TRUE(batch);
  EXPECT_EQ(batch->tokens.scalar_type(), at::kLong);
  EXPECT_EQ(batch->tokens.sizes(), (std::vector<int64_t>{4, 13}));
  EXPECT_EQ(batch->input.sizes(), (std::vector<int64_t>{4, 12}));
  EXPECT_EQ(batch->target.sizes(), (std::vector<int64_t>{4, 12}));
  EXPECT_TRUE(batch->input.is_contiguous() && batch->target.is_contiguous());
  const int64_t* t = batch->tokens.data_ptr<int64_t>();
  const int64_t* in = batch->input.data_ptr<int64_t>();
  const int64_t* tg = batch->target.data_ptr<int64_t>();
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 0; c < 12; ++c) {
      EXPECT_EQ(in[r * 12 + c], t[r * 13 + c]);
      EXPECT_EQ(tg[r * 12 + c], t[r * 13 + c + 1]);
    }
}

TEST_F(DataLoaderTest, StartBatchResumesWhereAFullRunWas) {
  DataLoaderOptions o;
  o.micro_batch_size = 2;
  o.num_epochs = 3;
  auto all = direct(o, 3);
  DataLoader probe(dataset, o);
  o.start_batch = probe.batches_per_epoch() + 5;  // inside the second epoch
  DataLoader loader(dataset, o);
  std::vector<Batch> got;
  while (auto b = loader.next()) got.push_back(std::move(*b));
  expect_same(got, std::vector<Batch>(all.begin() + o.start_batch, all.end()));
}

TEST_F(DataLoaderTest, EndlessLoaderKeepsGoingAndStopsWhenDestroyed) {
  DataLoaderOptions o;
  o.micro_batch_size = 8;
  o.num_epochs = 0;
  o.prefetch = 4;
  DataLoader loader(dataset, o);
  const int64_t n = loader.batches_per_epoch() * 3 + 1;
  int64_t last_epoch = -1;
  for (int64_t k = 0; k < n; ++k) last_epoch = loader.next()->epoch;
  EXPECT_EQ(last_epoch, 3);
}

TEST_F(DataLoaderTest, RefusesSharesWithoutABatch) {
  DataLoaderOptions o;
  o.micro_batch_size = 1000;
  EXPECT_THROW(DataLoader(dataset, o), std::runtime_error);
  o.micro_batch_size = 1;
  o.rank = 2;
  o.world_size = 2;
  EXPECT_THROW(DataLoader(dataset, o), std::runtime_error);
}

}  // namespace
