// GPT training samples from an indexed dataset: windows of seq_length + 1 tokens cut from the
// documents laid end to end, in a seeded shuffled order, one disjoint share per data-parallel
// rank. Megatron's doc_idx / sample_idx / shuffle_idx, one epoch at a time; no LibTorch.
//
// Epoch e:
//  - document order (doc_idx): every sequence of the dataset once (Megatron's GPTDataset treats
//    sequences as documents; a document-level file has one per document), shuffled with a
//    generator seeded by (seed, e, 0); in file order when shuffle is off.
//  - the token stream: those sequences' tokens concatenated (EOD tokens, when preprocessing
//    appended them, separate documents). Window j is stream[j*L, j*L + L + 1) for L =
//    seq_length, so consecutive windows share one token (the last target of one is the first
//    input of the next, as in Megatron's sample_idx) and a window crosses document boundaries.
//    samples_per_epoch = (tokens - 1) / L; the stream's last (< L) tokens are unused in that
//    epoch (with reshuffled documents, different ones each epoch).
//  - sample order (shuffle_idx): a permutation of the windows seeded by (seed, e, 1).
// Unlike Megatron, an epoch's stream stops at the epoch's end (no window spans two epochs) and
// there is no separate short final epoch; orders are not bit-equal to Megatron's (numpy's
// RandomState), but are the same on every platform: mt19937_64 output (fixed by the C++
// standard) and our own unbiased bounded draw and Fisher-Yates shuffle, not std::shuffle or
// std::uniform_int_distribution, whose results differ between standard libraries.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "dscpp/data/indexed_dataset.h"

namespace dscpp::data {

struct GPTDatasetOptions {
  int64_t seq_length = 1024;  // a sample holds seq_length + 1 tokens
  uint64_t seed = 1234;       // Megatron's default --seed
  bool shuffle = true;        // false: documents and samples in file order (e.g. validation)
  // > 0: the model's vocabulary; every token must lie in [0, vocab_size), checked over the whole
  // file when the dataset is built (IndexedDataset::check_token_ids). 0: not checked.
  int64_t vocab_size = 0;
};

// A uniformly random permutation of [0, n), the same for the same seed everywhere.
std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed);

// One epoch's three indices. Cheap to read from many threads once built.
class EpochIndex {
 public:
  int64_t epoch() const { return epoch_; }
  int64_t seq_length() const { return seq_length_; }
  int64_t num_samples() const { return static_cast<int64_t>(sample_order_.size()); }
  // doc_idx: the sequences of the dataset in the order this epoch's stream reads them.
  const std::vector<int64_t>& document_order() const { return document_order_; }
  // shuffle_idx: sample k of the epoch is window sample_order()[k].
  const std::vector<int64_t>& sample_order() const { return sample_order_; }

  // Window j (unshuffled): seq_length + 1 tokens into out.
  void read_window(int64_t j, int64_t* out) const;
  // Sample k (shuffled): window sample_order()[k].
  void read_sample(int64_t k, int64_t* out) const;

 private:
  friend class GPTDataset;
  EpochIndex() = default;

  std::shared_ptr<const IndexedDataset> data_;
  int64_t epoch_ = 0;
  int64_t seq_length_ = 0;
  std::vector<int64_t> document_order_;
  std::vector<int64_t> starts_;  // stream offset of each entry of document_order_, then the total
  std::vector<int64_t> sample_order_;
};

class GPTDataset {
 public:
  // Throws DataError when the dataset holds fewer than seq_length + 1 tokens, or a token outside
  // the vocabulary when options.vocab_size is set.
  GPTDataset(std::shared_ptr<const IndexedDataset> data, GPTDatasetOptions options);

  const GPTDatasetOptions& options() const { return options_; }
  const IndexedDataset& data() const { return *data_; }
  int64_t samples_per_epoch() const { return samples_per_epoch_; }
  // Builds epoch e's indices: O(sequences + samples).
  EpochIndex epoch(int64_t e) const;

 private:
  std::shared_ptr<const IndexedDataset> data_;
  GPTDatasetOptions options_;
  int64_t samples_per_epoch_ = 0;
};

// What one data-parallel rank reads of an epoch: torch's DistributedSampler with drop_last,
// i.e. rank r of W takes positions r, r + W, r + 2W, ... of the shuffled order (the first
// (samples / W) * W positions, so every rank gets as many and no sample goes to two ranks),
// and cuts its share into micro-batches of consecutive entries (a last partial one is dropped).
// Batch b of all ranks together is positions [b * mb * W, (b + 1) * mb * W): the same samples
// one rank with a micro-batch of mb * W would read as its batch b.
struct BatchPlan {
  int64_t micro_batch_size = 1;
  int64_t rank = 0;
  int64_t world_size = 1;

  int64_t batches(int64_t samples) const { return samples / world_size / micro_batch_size; }
  // The position in the shuffled order of row `row` of batch `b`.
  int64_t position(int64_t b, int64_t row) const {
    return rank + (b * micro_batch_size + row) * world_size;
  }
  void check() const;  // throws on a size < 1 or a rank outside [0, world_size)
};

// Batch b of `plan` in epoch `e`: micro_batch_size rows of seq_length + 1 tokens, row-major.
void read_batch(const EpochIndex& e, const BatchPlan& plan, int64_t b, int64_t* out);

}  // namespace dscpp::data
