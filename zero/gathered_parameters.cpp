// GatheredParameters: see gathered_parameters.h.
#include "dscpp/zero/gathered_parameters.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <iostream>
#include <map>
#include <set>

#include "dscpp/error.h"

namespace dscpp::zero {

namespace {

// Gathers `buckets` (ascending, the same on every rank); returns those that were at rest.
std::vector<int> gather_buckets(ZeroOptimizer& zero, const std::set<int>& buckets) {
  std::vector<int> gathered;
  zero.wait_all_published();  // stages 1-2: the scope reads the parameters
  if (zero.stage() < 3) return gathered;
  for (int b : buckets)
    if (zero.bucket_state(b) == ZeroOptimizer::BucketState::kRest) gathered.push_back(b);
  // All issued before any is waited for, so the all-gathers overlap.
  for (int b : buckets) zero.start_gather(b);
  for (int b : buckets) zero.finish_gather(b);
  return gathered;
}

}  // namespace

GatheredParameters::GatheredParameters(ZeroOptimizer& zero, comm::ProcessGroup& group,
                                       std::vector<at::Tensor> params, int modifier_rank,
                                       ExitErrorSink on_exit_error)
    : zero_(zero),
      group_(&group),
      params_(std::move(params)),
      modifier_rank_(modifier_rank),
      on_exit_error_(std::move(on_exit_error)) {
  if (modifier_rank < -1 || modifier_rank >= group.size())
    throw Error(fmt::format(
        "GatheredParameters: modifier_rank {} is not a rank of group '{}' ({} ranks; -1: no "
        "modifier)",
        modifier_rank, group.name(), group.size()));
  std::map<const void*, int> index;  // a parameter is known by its TensorImpl
  for (size_t i = 0; i < zero_.params().size(); ++i)
    index.emplace(zero_.params()[i].unsafeGetTensorImpl(), static_cast<int>(i));
  std::set<int> buckets;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!params_[k].defined())
      throw Error(fmt::format("GatheredParameters: tensor {} of the list is undefined", k));
    auto it = index.find(params_[k].unsafeGetTensorImpl());
    zero_index_.push_back(it == index.end() ? -1 : it->second);
    if (it != index.end()) buckets.insert(zero_.layout().params[it->second].bucket);
  }
  try {
    gathered_ = gather_buckets(zero_, buckets);
  } catch (...) {
    // Half gathered: what did arrive goes back to rest (no destructor runs for us).
    for (int b : buckets)
      if (zero_.bucket_state(b) != ZeroOptimizer::BucketState::kRest && !zero_.persistent(b))
        zero_.release_bucket(b);
    throw;
  }
}

GatheredParameters::GatheredParameters(ZeroOptimizer& zero) : zero_(zero), params_(zero.params()) {
  std::set<int> buckets;
  for (size_t i = 0; i < params_.size(); ++i) {
    zero_index_.push_back(static_cast<int>(i));
    buckets.insert(zero_.layout().params[i].bucket);
  }
  gathered_ = gather_buckets(zero_, buckets);
}

GatheredParameters::~GatheredParameters() {
  std::string failure;
  try {
    close();
  } catch (const std::exception& e) {
    failure = e.what();
  } catch (...) {
    failure = "an unknown exception";
  }
  release();
  if (!failure.empty()) report(failure);
}

void GatheredParameters::close() {
  if (modifier_rank_ < 0) return;
  at::NoGradGuard no_grad;
  const bool any_zero =
      std::any_of(zero_index_.begin(), zero_index_.end(), [](int i) { return i >= 0; });
  // Every gathered bucket takes the modifier's values into each rank's partitions.
  if (zero_.stage() == 3 && any_zero) zero_.scatter_gathered_from(modifier_rank_);
  spread_modified();
}

void GatheredParameters::spread_modified() {
  std::vector<comm::Work> works;
  const bool whole = zero_.stage() < 3;  // ZeRO's parameters are whole on every rank
  if (group_->size() > 1) {
    for (size_t k = 0; k < params_.size(); ++k) {
      if (zero_index_[k] >= 0 && !whole) continue;  // stage 3: scatter_gathered_from did it
      at::Tensor t = params_[k].detach();           // the parameter's own storage
      works.push_back(group_->broadcast(t, modifier_rank_));
    }
  }
  for (auto& w : works) w.wait();
  if (!whole) return;
  // This rank's fp32 master elements of each named parameter follow it; the others keep
  // their fp32 values (a refresh of the whole partition would round them to 16 bits).
  const auto& layout = zero_.layout();
  const int r = zero_.layout_rank();
  const at::Tensor& flat = zero_.flat_params();
  at::Tensor master = zero_.master_partition();
  for (int i : zero_index_) {
    if (i < 0) continue;
    const auto& lp = layout.params[i];
    const auto& b = layout.buckets[lp.bucket];
    const int64_t mine = b.begin + r * b.chunk;  // this rank's chunk of the bucket
    const int64_t lo = std::max(lp.offset, mine),
                  hi = std::min(lp.offset + lp.numel, mine + b.chunk);
    if (lo >= hi) continue;
    master.slice(0, b.part_offset + (lo - mine), b.part_offset + (hi - mine))
        .copy_(flat.slice(0, lo, hi));
  }
  zero_.set_master_partition(master);  // (a no-op where it is the master itself)
}

void GatheredParameters::release() noexcept {
  for (int b : gathered_) {
    try {
      if (!zero_.persistent(b)) zero_.release_bucket(b);
    } catch (const std::exception& e) {
      report(e.what());
    } catch (...) {
      report("an unknown exception while releasing a bucket");
    }
  }
  gathered_.clear();
}

void GatheredParameters::report(const std::string& what) noexcept {
  const std::string message = "GatheredParameters failed when it closed: " + what;
  if (on_exit_error_) {
    try {
      on_exit_error_(message);
      return;
    } catch (...) {
    }
  }
  std::cerr << "dscpp: " << message << "; terminating, since the ranks no longer agree\n";
  std::terminate();
}

}  // namespace dscpp::zero
