// ParamStore: see param_store.h.
#include "dscpp/zero/param_store.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "dscpp/error.h"
#include "dscpp/ops/pinned_memory.h"
#include "dscpp/zero/relayout.h"

namespace dscpp::zero {

namespace {

// Bucket b's chunk of a partition laid out by `l`.
at::Tensor chunk_in(const FlatLayout& l, const at::Tensor& partition, int b) {
  const auto& bucket = l.buckets.at(b);
  return partition.slice(0, bucket.part_offset, bucket.part_offset + bucket.chunk);
}

}  // namespace

ParamStore::ParamStore(std::vector<at::Tensor> params, const FlatLayout& layout,
                       std::shared_ptr<comm::ProcessGroup> group, ParamOffloadOptions offload)
    : layout_(layout), group_(std::move(group)), params_(std::move(params)), offload_(offload) {
  if (offload_.enabled && (offload_.buffer_count < 1 || offload_.buffer_size < 1))
    throw Error("offload_param: buffer_count and buffer_size must be positive");
  const auto opts = params_.empty() ? at::TensorOptions().dtype(at::kFloat) : params_[0].options();
  flat_params_ = at::zeros({layout_.total}, opts);
  for (size_t i = 0; i < params_.size(); ++i) {
    param_shapes_.push_back(params_[i].sizes().vec());
    const auto& lp = layout_.params[i];
    at::Tensor view =
        flat_params_.slice(0, lp.offset, lp.offset + lp.numel).view(params_[i].sizes());
    view.copy_(params_[i].detach());
    // The module's parameter now lives in the flat buffer.
    params_[i].set_data(view);
  }
  // Every rank starts from rank 0's weights, as DeepSpeed broadcasts the model at init.
  if (group_->size() > 1) group_->broadcast(flat_params_, 0).wait();
}

void ParamStore::add_memory(MemoryBreakdown& m) const {
  if (flat_params_.defined()) m.push_back({"params16.flat", bytes_of(flat_params_), true});
  if (part16_.defined()) m.push_back({"params16.partition", bytes_of(part16_), !offload_.enabled});
  int64_t persistent = 0, gathered = 0, staging = 0;
  for (const auto& g : buckets16_) (g.persistent ? persistent : gathered) += bytes_of(g.buffer);
  for (const auto& t : staging_pool_) staging += bytes_of(t);
  if (part16_.defined()) {
    m.push_back({"params16.persistent", persistent, true});
    m.push_back({"params16.gathered", gathered, true});
  }
  if (offload_.enabled) m.push_back({"params16.staging", staging, true});
}

void ParamStore::keep_only_partition(const at::Tensor& master) {
  device_options_ = flat_params_.options();
  buckets16_.resize(layout_.buckets.size());
  if (offload_.enabled) {
    keep_partition16(master);
  } else {
    // On the parameters' device (an offloaded master is on the host).
    part16_ = master.to(flat_params_.device(), flat_params_.scalar_type());
  }
  for (auto& p : params_) p.set_data(at::empty({0}, device_options_));
  flat_params_ = at::Tensor();
}

void ParamStore::keep_partition16(const at::Tensor& values) {
  // Parameter offload: in host memory, page-locked where a GPU copies from it.
  const bool pin = offload_.pin_memory && !device_options_.device().is_cpu();
  int64_t resident = layout_.partition;
  if (offload_.nvme.enabled) {
    // The buckets from the partition's start that fit in max_in_cpu stay in memory, the
    // others go to files (the old files go first: the new ones take their names).
    std::vector<int64_t> chunks;
    std::vector<bool> in_file;
    int64_t kept = 0;
    for (const auto& bucket : layout_.buckets) {
      const bool swap =
          (!in_file.empty() && in_file.back()) || kept + bucket.chunk > offload_.nvme.max_in_cpu;
      if (!swap) kept += bucket.chunk;
      chunks.push_back(bucket.chunk);
      in_file.push_back(swap);
    }
    resident = kept;
    swap_holders_.clear();
    swap_.reset();
    swap_ = std::make_unique<ParamSwapper>(offload_.nvme, device_options_.dtype().toScalarType(),
                                           std::move(chunks), std::move(in_file));
  }
  // The buffer it has where it fits, else a new one, the old one gone first.
  if (!part16_.defined() || part16_.numel() != resident) {
    part16_ = at::Tensor();
    part16_ = ops::host_empty(resident, device_options_.dtype().toScalarType(), pin);
  }
  part16_.copy_(values.narrow(0, 0, resident));
  for (int b = 0; b < static_cast<int>(layout_.buckets.size()); ++b)
    if (swapped(b)) store_chunk(b, partition_chunk(values, b));
}

void ParamStore::store_chunk(int b, const at::Tensor& values) {
  if (!swapped(b)) {
    partition_chunk(part16_, b).copy_(values);
    return;
  }
  if (!swap_->has_buffer(b)) make_room();
  at::Tensor t = swap_->stage_write(b);
  if (t.data_ptr() != values.data_ptr()) t.copy_(values);
  swap_->write(b);
}

void ParamStore::read_partition16(const FlatLayout& l, at::Tensor& into) {
  into.narrow(0, 0, part16_.numel()).copy_(part16_);
  for (int b = 0; b < static_cast<int>(l.buckets.size()); ++b) {
    if (!swapped(b)) continue;
    if (!swap_->has_buffer(b)) make_room();
    chunk_in(l, into, b).copy_(swap_->acquire(b));
    swap_->let_go(b);
  }
}

void ParamStore::make_room() {
  while (!swap_->buffer_available()) {
    if (swap_holders_.empty())
      throw Error("offload_param: no NVMe swap buffer is free and no gather holds one");
    finish_gather(swap_holders_.front());
  }
}

bool ParamStore::read_ahead(int b) {
  if (!swapped(b) || buckets16_.at(b).state != BucketState::kRest) return true;
  return swap_->read_ahead(b);
}

bool ParamStore::can_gather_now(int b) const {
  return !swapped(b) || swap_->has_buffer(b) || swap_->buffer_available();
}

at::Tensor ParamStore::swap_up(const at::Tensor& host, at::Tensor& holder) {
  // On the CPU the swap buffer is the gather's input itself; on a GPU the copy up waits, so
  // that the buffer may take another chunk as soon as it is let go.
  if (device_options_.device().is_cpu()) return host;
  return bring_up(host, holder, /*blocking=*/true);
}

void ParamStore::relayout(const FlatLayout& old) {
  if (partitioned()) throw Error("ParamStore: a partitioned store keeps its layout");
  wait_all_published();
  if (old.total == layout_.total) {
    // In its own storage: the device holds no second copy of the model.
    relay_flat_in_place(old, layout_, flat_params_);
  } else {
    // Another size (the buckets' padding moved): through the host, the old buffer let go
    // before the new one is made.
    const at::Tensor host = flat_params_.cpu();
    for (auto& p : params_) p.set_data(at::empty({0}, flat_params_.options()));
    const c10::Device device = flat_params_.device();
    flat_params_ = at::Tensor();
    flat_params_ = relay_flat(old, layout_, host).to(device);
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& lp = layout_.params[i];
    params_[i].set_data(
        flat_params_.slice(0, lp.offset, lp.offset + lp.numel).view(param_shapes_[i]));
  }
}

int ParamStore::chunk_rank() const {
  return layout_.world_size == 1 ? 0 : group_->rank();
}

at::Tensor ParamStore::partition_chunk(const at::Tensor& partition, int b) const {
  const auto& bucket = layout_.buckets[b];
  return partition.slice(0, bucket.part_offset, bucket.part_offset + bucket.chunk);
}

at::Tensor ParamStore::chunk_destination(int b) {
  // (a host partition on a GPU: the update writes on the device, publish_bucket copies down;
  // NVMe on the CPU: into the swap buffer the write goes from)
  if (partitioned() && swapped(b) && device_options_.device().is_cpu()) {
    if (!swap_->has_buffer(b)) make_room();
    return swap_->stage_write(b);
  }
  if (partitioned())
    return part16_.device() == device_options_.device()
               ? partition_chunk(part16_, b)
               : at::empty({layout_.buckets[b].chunk}, device_options_);
  const auto& bucket = layout_.buckets[b];
  const int64_t r = chunk_rank();
  // NCCL all-gathers in place (the input at the rank's offset in the output); Gloo's is not
  // documented to, so on the CPU the chunk goes through its own tensor there.
  if (layout_.world_size == 1 || flat_params_.is_cuda())
    return flat_params_.slice(0, bucket.begin + r * bucket.chunk,
                              bucket.begin + (r + 1) * bucket.chunk);
  return at::empty({bucket.chunk}, flat_params_.options());
}

comm::Work ParamStore::gather_chunks(at::Tensor whole, const at::Tensor& mine) {
  const int64_t r = chunk_rank();
  at::Tensor place = whole.slice(0, r * mine.numel(), (r + 1) * mine.numel());
  const bool in_place = place.data_ptr() == mine.data_ptr();
  if (layout_.world_size > 1 && group_->size() > 1) return group_->all_gather(whole, mine);
  if (!in_place) place.copy_(mine);
  return comm::Work();
}

comm::Work ParamStore::publish_bucket(int b, const at::Tensor& chunk16) {
  if (partitioned() && swapped(b)) {
    // NVMe: the chunk goes to its file, through a swap buffer (a gathered bucket is refreshed
    // from it first).
    Gathered& g = buckets16_.at(b);
    if (g.state != BucketState::kRest) finish_gather(b);
    if (!swap_->has_buffer(b)) make_room();
    at::Tensor mine = swap_->stage_write(b);
    if (mine.data_ptr() != chunk16.data_ptr()) mine.copy_(chunk16);
    if (g.state != BucketState::kRest) {
      gather_chunks(g.buffer, swap_up(mine, g.staging)).wait();
      give_back(g.staging);
    }
    swap_->write(b);
    return comm::Work();
  }
  if (partitioned()) {
    // Only this rank's 16-bit chunk changes; the next gather spreads it. A bucket gathered
    // now (persistent, or inside a GatheredParameters scope) is refreshed in place.
    at::Tensor mine = partition_chunk(part16_, b);
    if (mine.data_ptr() != chunk16.data_ptr()) mine.copy_(chunk16);
    Gathered& g = buckets16_.at(b);
    if (g.state == BucketState::kRest) return comm::Work();
    finish_gather(b);
    comm::Work w = gather_chunks(g.buffer, bring_up(mine, g.staging));
    if (g.staging.defined()) {
      w.wait();  // (the staging buffer is free again once the gather is done)
      give_back(g.staging);
      return comm::Work();
    }
    return w;
  }
  const auto& bucket = layout_.buckets[b];
  // The collective keeps the chunk alive until it has run.
  return gather_chunks(flat_params_.slice(0, bucket.begin, bucket.end), chunk16);
}

void ParamStore::publish(const at::Tensor& master) {
  wait_all_published();
  std::vector<comm::Work> works;
  for (int b = 0; b < static_cast<int>(layout_.buckets.size()); ++b) {
    at::Tensor chunk16 = chunk_destination(b);
    chunk16.copy_(partition_chunk(master, b));
    works.push_back(publish_bucket(b, chunk16));
  }
  for (auto& w : works) w.wait();
}

void ParamStore::copy_partition_into(at::Tensor& master) {
  wait_all_published();
  // Stage 3: the 16-bit partition is the parameters' truth.
  if (partitioned() && swap_) {
    read_partition16(layout_, master);
    return;
  }
  if (partitioned()) {
    master.copy_(part16_);
    return;
  }
  const int64_t r = chunk_rank();
  for (int b = 0; b < static_cast<int>(layout_.buckets.size()); ++b) {
    const auto& bucket = layout_.buckets[b];
    partition_chunk(master, b).copy_(flat_params_.slice(0, bucket.begin + r * bucket.chunk,
                                                        bucket.begin + (r + 1) * bucket.chunk));
  }
}

void ParamStore::defer(int b, comm::Work work) {
  if (!work.defined()) return;
  if (published_.size() < layout_.buckets.size()) published_.resize(layout_.buckets.size());
  wait_published(b);
  published_[b] = std::move(work);
  ++pending_publishes_;
}

void ParamStore::wait_published(int b) {
  if (pending_publishes_ == 0) return;
  comm::Work& w = published_.at(b);
  if (!w.defined()) return;
  w.wait();
  w = comm::Work();
  --pending_publishes_;
}

void ParamStore::wait_all_published() {
  for (size_t b = 0; pending_publishes_ > 0 && b < published_.size(); ++b)
    wait_published(static_cast<int>(b));
}

bool ParamStore::gathered() const {
  for (const auto& g : buckets16_)
    if (g.state != BucketState::kGathered) return false;
  return true;
}

ParamStore::BucketState ParamStore::bucket_state(int b) const {
  return partitioned() ? buckets16_.at(b).state : BucketState::kGathered;
}

bool ParamStore::persistent(int b) const {
  return partitioned() && buckets16_.at(b).persistent;
}

void ParamStore::start_gather(int b) {
  if (!partitioned()) return;
  Gathered& g = buckets16_.at(b);
  if (g.state != BucketState::kRest) return;
  const auto& bucket = layout_.buckets[b];
  g.buffer = at::empty({bucket.end - bucket.begin}, device_options_);
  at::Tensor mine;
  if (swapped(b)) {
    if (!swap_->has_buffer(b)) make_room();
    mine = swap_up(swap_->acquire(b), g.staging);
    if (device_options_.device().is_cpu()) {
      g.swap_held = true;  // until the all-gather has read it
      swap_holders_.push_back(b);
    } else {
      swap_->let_go(b);
    }
  } else {
    mine = bring_up(partition_chunk(part16_, b), g.staging);
  }
  g.work = gather_chunks(g.buffer, mine);
  g.state = BucketState::kInFlight;
  if (!g.persistent) {
    live_ += g.buffer.numel();
    peak_live_ = std::max(peak_live_, live_);
  }
  ++gathers_;
}

void ParamStore::finish_gather(int b) {
  if (!partitioned()) return;
  Gathered& g = buckets16_.at(b);
  if (g.state == BucketState::kGathered) return;
  if (g.state == BucketState::kRest) start_gather(b);
  g.work.wait();
  g.work = comm::Work();
  give_back(g.staging);
  let_go_swap(b);
  const auto& bucket = layout_.buckets[b];
  for (int i : bucket.params) {
    const auto& lp = layout_.params[i];
    params_[i].set_data(
        g.buffer.slice(0, lp.offset - bucket.begin, lp.offset - bucket.begin + lp.numel)
            .view(param_shapes_[i]));
  }
  g.state = BucketState::kGathered;
}

void ParamStore::release_bucket(int b) {
  if (!partitioned()) return;
  Gathered& g = buckets16_.at(b);
  if (g.state == BucketState::kRest) return;
  if (g.state == BucketState::kInFlight) g.work.wait();  // a collective in flight keeps its buffer
  g.work = comm::Work();
  give_back(g.staging);
  let_go_swap(b);
  // A parameter at rest is an empty tensor of its dtype and device, as in DeepSpeed; the
  // bucket's buffer is freed with the last view of it.
  for (int i : layout_.buckets[b].params) params_[i].set_data(at::empty({0}, device_options_));
  if (!g.persistent) live_ -= g.buffer.numel();
  g.buffer = at::Tensor();
  g.state = BucketState::kRest;
}

void ParamStore::make_persistent(int b) {
  if (!partitioned()) return;
  Gathered& g = buckets16_.at(b);
  if (g.persistent) return;
  if (g.state != BucketState::kRest) live_ -= g.buffer.numel();
  g.persistent = true;
  finish_gather(b);
}

void ParamStore::gather() {
  wait_all_published();  // stages 1-2: a GatheredParameters scope reads the parameters
  if (!partitioned()) return;
  for (size_t b = 0; b < buckets16_.size(); ++b) start_gather(static_cast<int>(b));
  for (size_t b = 0; b < buckets16_.size(); ++b) finish_gather(static_cast<int>(b));
}

void ParamStore::release() {
  if (!partitioned()) return;
  for (size_t b = 0; b < buckets16_.size(); ++b)
    if (!buckets16_[b].persistent) release_bucket(static_cast<int>(b));
  if (swap_) swap_->drop_reads_ahead();  // (reads ahead for uses that did not come)
}

void ParamStore::scatter_gathered_from(int src_rank, at::Tensor& master) {
  if (!partitioned()) return;
  const int r = group_->rank();
  for (size_t b = 0; b < buckets16_.size(); ++b) {
    Gathered& g = buckets16_[b];
    if (g.state == BucketState::kRest) continue;
    finish_gather(static_cast<int>(b));
    // Every rank takes src_rank's values, then keeps its own chunk of them.
    if (group_->size() > 1) group_->broadcast(g.buffer, src_rank).wait();
    const auto& bucket = layout_.buckets[b];
    at::Tensor mine = g.buffer.slice(0, r * bucket.chunk, (r + 1) * bucket.chunk);
    store_chunk(static_cast<int>(b), mine);
    partition_chunk(master, static_cast<int>(b)).copy_(mine);
  }
}

void ParamStore::let_go_swap(int b) {
  Gathered& g = buckets16_.at(b);
  if (!g.swap_held) return;
  g.swap_held = false;
  swap_->let_go(b);
  swap_holders_.erase(std::find(swap_holders_.begin(), swap_holders_.end(), b));
}

at::Tensor ParamStore::bring_up(const at::Tensor& chunk, at::Tensor& holder, bool blocking) {
  if (!offload_.enabled) return chunk;
  const int64_t n = chunk.numel();
  int k = -1;
  if (n <= offload_.buffer_size) {
    for (size_t i = 0; i < staging_pool_.size() && k < 0; ++i)
      if (!staging_busy_[i]) k = static_cast<int>(i);
    if (k < 0 && static_cast<int64_t>(staging_pool_.size()) < offload_.buffer_count) {
      staging_pool_.push_back(at::empty({offload_.buffer_size}, device_options_));
      staging_busy_.push_back(false);
      k = static_cast<int>(staging_pool_.size()) - 1;
    }
  }
  // Every pooled buffer busy (more gathers in flight than buffer_count), or a chunk larger
  // than buffer_size: a buffer of its own for this gather.
  at::Tensor up;
  if (k >= 0) {
    staging_busy_[k] = true;
    ++staged_gathers_;
    up = staging_pool_[k].narrow(0, 0, n);
  } else {
    up = at::empty({n}, device_options_);
  }
  // Non-blocking from page-locked memory: the copy is queued before the collective on the
  // current stream, which the collective waits for.
  up.copy_(chunk, /*non_blocking=*/!up.is_cpu() && !blocking);
  holder = k >= 0 ? staging_pool_[k] : up;
  return up;
}

void ParamStore::give_back(at::Tensor& holder) {
  if (!holder.defined()) return;
  for (size_t i = 0; i < staging_pool_.size(); ++i)
    if (staging_pool_[i].is_same(holder)) staging_busy_[i] = false;
  holder = at::Tensor();
}

int64_t ParamStore::params_numel_held() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.numel();
  return n;
}

}  // namespace dscpp::zero
