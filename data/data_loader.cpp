// DataLoader: batches as tensors, the epoch walk and the prefetch thread.
#include "dscpp/data/data_loader.h"

#include <ATen/ops/empty.h>

#include <stdexcept>
#include <string>

#include "dscpp/error.h"

namespace dscpp::data {

Batch make_batch(const EpochIndex& e, const BatchPlan& plan, int64_t b) {
  const int64_t seq = e.seq_length();
  Batch batch;
  batch.tokens = at::empty({plan.micro_batch_size, seq + 1}, at::kLong);
  read_batch(e, plan, b, batch.tokens.data_ptr<int64_t>());
  // Contiguous copies rather than views: a model's loss commonly calls .view(-1) on them.
  batch.input = batch.tokens.narrow(1, 0, seq).contiguous();
  batch.target = batch.tokens.narrow(1, 1, seq).contiguous();
  batch.epoch = e.epoch();
  batch.index = b;
  return batch;
}

DataLoader::DataLoader(std::shared_ptr<const GPTDataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  if (!dataset_) throw dscpp::Error("DataLoader: no dataset");
  plan_ = {options_.micro_batch_size, options_.rank, options_.world_size};
  plan_.check();
  if (options_.num_epochs < 0 || options_.prefetch < 0 || options_.start_batch < 0)
    throw dscpp::Error("DataLoader: num_epochs, prefetch and start_batch must be >= 0");
  batches_per_epoch_ = plan_.batches(dataset_->samples_per_epoch());
  if (batches_per_epoch_ < 1)
    throw dscpp::Error(
        dataset_->data().prefix() + ": " + std::to_string(dataset_->samples_per_epoch()) +
        " samples per epoch give no micro-batch of " + std::to_string(plan_.micro_batch_size) +
        " to each of " + std::to_string(plan_.world_size) + " ranks");
  epoch_ = options_.start_batch / batches_per_epoch_;
  batch_ = options_.start_batch % batches_per_epoch_;
  if (options_.prefetch > 0)
    prefetcher_ = std::make_unique<Prefetcher<Batch>>([this] { return produce(); },
                                                      static_cast<size_t>(options_.prefetch));
}

DataLoader::~DataLoader() = default;

std::optional<Batch> DataLoader::produce() {
  if (options_.num_epochs > 0 && epoch_ >= options_.num_epochs) return std::nullopt;
  if (!current_ || current_->epoch() != epoch_) current_ = dataset_->epoch(epoch_);
  Batch batch = make_batch(*current_, plan_, batch_);
  if (++batch_ == batches_per_epoch_) batch_ = 0, ++epoch_;
  return batch;
}

std::optional<Batch> DataLoader::next() {
  return prefetcher_ ? prefetcher_->next() : produce();
}

}  // namespace dscpp::data
