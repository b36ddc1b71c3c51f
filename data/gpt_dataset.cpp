// GPTDataset: per-epoch document order, window lookup and sample order.
#include "dscpp/data/gpt_dataset.h"

#include <algorithm>
#include <random>
#include <stdexcept>
#include <string>

#include "dscpp/error.h"

namespace dscpp::data {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Independent streams for (seed, epoch, which index): nearby seeds and epochs give unrelated
// generator states.
uint64_t stream_seed(uint64_t seed, int64_t epoch, uint64_t which) {
  return splitmix64(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(epoch)) ^ which);
}

// Uniform in [0, n): rejection of the biased low range (Lemire's threshold), then modulo.
uint64_t bounded(std::mt19937_64& rng, uint64_t n) {
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    uint64_t r = rng();
    if (r >= threshold) return r % n;
  }
}

std::vector<int64_t> identity(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

}  // namespace

std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> v = identity(n);
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(bounded(rng, static_cast<uint64_t>(i) + 1));
    std::swap(v[static_cast<size_t>(i)], v[static_cast<size_t>(j)]);
  }
  return v;
}

GPTDataset::GPTDataset(std::shared_ptr<const IndexedDataset> data, GPTDatasetOptions options)
    : data_(std::move(data)), options_(options) {
  if (!data_) throw dscpp::Error("GPTDataset: no indexed dataset");
  if (options_.seq_length < 1)
    throw dscpp::Error("GPTDataset: seq_length must be >= 1, got " +
                       std::to_string(options_.seq_length));
  samples_per_epoch_ =
      data_->num_tokens() < 1 ? 0 : (data_->num_tokens() - 1) / options_.seq_length;
  if (samples_per_epoch_ < 1)
    throw dscpp::Error(data_->prefix() + ": " + std::to_string(data_->num_tokens()) +
                       " tokens cannot fill one sample of seq_length + 1 = " +
                       std::to_string(options_.seq_length + 1));
}

EpochIndex GPTDataset::epoch(int64_t e) const {
  if (e < 0) throw dscpp::Error("GPTDataset: negative epoch " + std::to_string(e));
  EpochIndex index;
  index.data_ = data_;
  index.epoch_ = e;
  index.seq_length_ = options_.seq_length;
  const int64_t n = data_->num_sequences();
  index.document_order_ =
      options_.shuffle ? seeded_permutation(n, stream_seed(options_.seed, e, 0)) : identity(n);
  index.starts_.resize(static_cast<size_t>(n) + 1);
  int64_t total = 0;
  for (int64_t k = 0; k < n; ++k) {
    index.starts_[static_cast<size_t>(k)] = total;
    total += data_->sequence_length(index.document_order_[static_cast<size_t>(k)]);
  }
  index.starts_[static_cast<size_t>(n)] = total;
  index.sample_order_ =
      options_.shuffle ? seeded_permutation(samples_per_epoch_, stream_seed(options_.seed, e, 1))
                       : identity(samples_per_epoch_);
  return index;
}

void EpochIndex::read_window(int64_t j, int64_t* out) const {
  if (j < 0 || j >= num_samples())
    throw dscpp::Error(data_->prefix() + ": window " + std::to_string(j) +
                       " out of range (epoch has " + std::to_string(num_samples()) + ")");
  int64_t pos = j * seq_length_, need = seq_length_ + 1;
  // The last entry starting at or before pos: past any empty sequences that start there too.
  auto it = std::upper_bound(starts_.begin(), starts_.end() - 1, pos);
  auto k = static_cast<size_t>(it - starts_.begin()) - 1;
  while (need > 0) {
    int64_t seq = document_order_[k];
    int64_t offset = pos - starts_[k];
    int64_t take = std::min<int64_t>(need, data_->sequence_length(seq) - offset);
    if (take > 0) {
      data_->read(seq, offset, take, out);
      out += take, pos += take, need -= take;
    }
    ++k;
  }
}

void EpochIndex::read_sample(int64_t k, int64_t* out) const {
  if (k < 0 || k >= num_samples())
    throw dscpp::Error(data_->prefix() + ": sample " + std::to_string(k) +
                       " out of range (epoch has " + std::to_string(num_samples()) + ")");
  read_window(sample_order_[static_cast<size_t>(k)], out);
}

void BatchPlan::check() const {
  if (micro_batch_size < 1 || world_size < 1 || rank < 0 || rank >= world_size)
    throw dscpp::Error(
        "data loader: need micro_batch_size >= 1 and 0 <= rank < "
        "world_size; got micro_batch_size " +
        std::to_string(micro_batch_size) + ", rank " + std::to_string(rank) + ", world_size " +
        std::to_string(world_size));
}

void read_batch(const EpochIndex& e, const BatchPlan& plan, int64_t b, int64_t* out) {
  if (b < 0 || b >= plan.batches(e.num_samples()))
    throw dscpp::Error("data loader: batch " + std::to_string(b) + " out of range (rank " +
                       std::to_string(plan.rank) + " has " +
                       std::to_string(plan.batches(e.num_samples())) + " per epoch)");
  const int64_t row_size = e.seq_length() + 1;
  for (int64_t row = 0; row < plan.micro_batch_size; ++row)
    e.read_sample(plan.position(b, row), out + row * row_size);
}

}  // namespace dscpp::data
