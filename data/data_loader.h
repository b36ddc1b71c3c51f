// DataLoader: a data-parallel rank's GPT batches as LibTorch tensors, read ahead by a
// background thread.
//
// Batches follow gpt_dataset.h: epoch 0's batches 0 .. batches_per_epoch() - 1 for this rank,
// then epoch 1's (reshuffled), and so on for num_epochs epochs (0: without end). A Batch holds
// tokens, int64 [micro_batch_size, seq_length + 1], and the usual pair cut from it: input =
// tokens[:, :-1] and target = tokens[:, 1:], both contiguous int64 [micro_batch_size,
// seq_length], on the CPU (moving them to a device is the engine's business).
// With prefetch > 0 a thread builds up to that many batches ahead (the next epoch's indices
// too); errors on that thread are rethrown by next(); the destructor stops and joins it.
//   for (auto& batch : loader) engine.forward(batch.input, batch.target) ...
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>

#include "dscpp/data/gpt_dataset.h"
#include "dscpp/data/prefetch.h"

namespace dscpp::data {

struct Batch {
  at::Tensor tokens;  // int64 [micro_batch_size, seq_length + 1]
  at::Tensor input;   // tokens[:, :-1], contiguous
  at::Tensor target;  // tokens[:, 1:], contiguous
  int64_t epoch = 0;
  int64_t index = 0;  // the batch's number within its epoch, for this rank
};

struct DataLoaderOptions {
  int64_t micro_batch_size = 1;
  int64_t rank = 0;         // this rank's place among the data-parallel ranks
  int64_t world_size = 1;   // data-parallel ranks
  int64_t num_epochs = 1;   // 0: endless
  int64_t prefetch = 2;     // batches read ahead on a background thread; 0: read in next()
  int64_t start_batch = 0;  // batches of this rank to skip, counted across epochs (resuming)
};

// Batch b of `plan` in epoch `e`, read directly on the caller's thread.
Batch make_batch(const EpochIndex& e, const BatchPlan& plan, int64_t b);

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const GPTDataset> dataset, DataLoaderOptions options);
  ~DataLoader();

  // The next batch; nullopt after the last epoch.
  std::optional<Batch> next();
  int64_t batches_per_epoch() const { return batches_per_epoch_; }

  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = Batch*;
    using reference = Batch&;
    iterator() = default;
    explicit iterator(DataLoader* loader) : loader_(loader) { ++*this; }
    Batch& operator*() { return *current_; }
    Batch* operator->() { return &*current_; }
    iterator& operator++() {
      current_ = loader_->next();
      if (!current_) loader_ = nullptr;
      return *this;
    }
    bool operator==(const iterator& o) const { return loader_ == o.loader_; }
    bool operator!=(const iterator& o) const { return loader_ != o.loader_; }

   private:
    DataLoader* loader_ = nullptr;
    std::optional<Batch> current_;
  };
  iterator begin() { return iterator(this); }
  iterator end() { return iterator(); }

 private:
  std::optional<Batch> produce();  // the next batch, on whichever thread reads

  std::shared_ptr<const GPTDataset> dataset_;
  DataLoaderOptions options_;
  BatchPlan plan_;
  int64_t batches_per_epoch_ = 0;
  int64_t epoch_ = 0, batch_ = 0;                  // the next batch to produce
  std::optional<EpochIndex> current_;              // epoch_'s indices, once built
  std::unique_ptr<Prefetcher<Batch>> prefetcher_;  // last: its thread uses the members above
};

}  // namespace dscpp::data
