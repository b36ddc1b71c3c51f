// ZeRO's parameter store (docs/architecture.md, "Parameter store"): where the trainable parameters
// live. Stages 0-2: one flat buffer of the training type whose views are the module's parameters.
// Stage 3: this rank's 16-bit chunks only (laid out as its partition); a parameter at rest
// holds an empty tensor, and is gathered a bucket at a time (the bucket's chunks all-gathered
// into a buffer of its own, its parameters views of it); persistent buckets stay gathered.
// publish_bucket() is the one routine that writes an updated chunk back, at every stage; with
// deferred all-gathers (stages 1-2) its collective stays in flight until wait_published().
#pragma once

#include <ATen/core/Tensor.h>

#include <deque>
#include <memory>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/zero/flat_layout.h"
#include "dscpp/zero/memory_breakdown.h"
#include "dscpp/zero/param_swap.h"

namespace dscpp::zero {

// ZeRO-Offload of the parameters (offload_param.device = "cpu", stage 3): the 16-bit
// partition lives in host memory (page-locked where a GPU is) and each bucket's chunk comes
// up to the training device only for its all-gather, through one of buffer_count staging
// buffers of buffer_size elements (a chunk larger than that gets a buffer of its own for that
// gather); the staging buffer is free again once the gather is done.
// With nvme (offload_param.device = "nvme", ZeRO-Infinity): the chunks of the buckets past the
// partition's first max_in_cpu elements live in files instead (zero/param_swap.h), read into
// one of nvme.buffer_count host buffers for their gather (ahead of it, where LayerGather asks),
// and written back from one at the publish; the rest stays in host memory as above. When every
// buffer is held by a gather in flight, a new gather first finishes the oldest of those.
struct ParamOffloadOptions {
  bool enabled = false;
  bool pin_memory = true;           // only where a GPU is
  int64_t buffer_count = 5;         // staging buffers on the training device
  int64_t buffer_size = 100000000;  // elements each
  ParamNvmeOptions nvme;
};

class ParamStore {
 public:
  enum class BucketState { kRest, kInFlight, kGathered };

  // params: the trainable parameters in registration order, in the training dtype and on the
  // training device; they become views of the flat buffer, with rank 0's values on every rank
  // (as DeepSpeed broadcasts the model at init). The layout must outlive the store.
  ParamStore(std::vector<at::Tensor> params, const FlatLayout& layout,
             std::shared_ptr<comm::ProcessGroup> group, ParamOffloadOptions offload = {});

  // Stage 3, once: keeps this rank's chunks (from `master`, the fp32 partition) in 16 bits and
  // releases the parameters and the flat buffer.
  void keep_only_partition(const at::Tensor& master);
  bool partitioned() const { return part16_.defined(); }
  // Stages 0-2, before anything else is laid out (zero_optimizer.h): the layout changed from
  // `old`, and the parameters' values move to their new places in the flat buffer.
  void relayout(const FlatLayout& old);

  // Which chunk of every bucket this rank owns (0 where the layout has one partition).
  int chunk_rank() const;
  // Where this rank's updated 16-bit chunk of bucket b is to be written before
  // publish_bucket(b, ...): its place in the partition (stage 3) or in the flat buffer (one
  // partition, or a GPU, where NCCL all-gathers in place), else a tensor of its own.
  at::Tensor chunk_destination(int b);
  // Spreads bucket b's updated chunk: into every rank's flat buffer (stages 0-2; a copy with
  // one partition, an all-gather otherwise), or into the partition, all-gathered again where
  // the bucket is gathered now (stage 3). Returns the collective (undefined: none, or done).
  comm::Work publish_bucket(int b, const at::Tensor& chunk16);
  // Every bucket from the fp32 partition (after a step or a checkpoint load); waits.
  void publish(const at::Tensor& master);
  // The other way: this rank's chunks of the parameters into the fp32 partition.
  void copy_partition_into(at::Tensor& master);

  // Deferred all-gathers (stages 1-2): bucket b's publish left in flight until waited for.
  void defer(int b, comm::Work work);
  void wait_published(int b);
  void wait_all_published();
  bool publish_pending() const { return pending_publishes_ > 0; }

  at::Tensor& flat_params() {  // stages 0-2
    wait_all_published();
    return flat_params_;
  }
  // Stage 3's gathering; no-ops at stages 0-2 (see ZeroOptimizer for the contract).
  void gather();
  void release();
  bool gathered() const;
  void start_gather(int b);
  void finish_gather(int b);
  void release_bucket(int b);
  BucketState bucket_state(int b) const;
  void make_persistent(int b);
  bool persistent(int b) const;
  // Parameter NVMe offload: issues bucket b's read ahead of its gather if a buffer is free
  // (false: none is; true: issued, or nothing to read). can_gather_now: b's gather would not
  // have to finish another one first to get a buffer.
  bool read_ahead(int b);
  bool can_gather_now(int b) const;
  ParamSwapper* swapper() { return swap_.get(); }
  // Elements of the 16-bit partition in host memory for good (all of it without NVMe).
  int64_t resident16_numel() const { return part16_.defined() ? part16_.numel() : 0; }
  int64_t live_numel() const { return live_; }
  int64_t peak_live_numel() const { return peak_live_; }
  // While gathered: every rank takes rank src's values into its partition, 16-bit and `master`.
  void scatter_gathered_from(int src_rank, at::Tensor& master);
  int64_t params_numel_held() const;
  // This rank's 16-bit partition, wherever it lives (memory, or files and memory).
  int64_t partition16_numel() const { return partitioned() ? layout_.partition : 0; }
  // Stage 3's 16-bit partition (its resident part with NVMe), for tests and reports.
  const at::Tensor& partition16() const { return part16_; }
  // Where the 16-bit partition lives (the host with parameter offload).
  c10::Device partition16_device() const {
    return part16_.defined() ? part16_.device() : c10::Device(c10::kCPU);
  }
  // Parameter offload: gathers that came up through a pooled staging buffer, and the pool's
  // size now (at most buffer_count).
  int64_t staged_gathers() const { return staged_gathers_; }
  int staging_buffers() const { return static_cast<int>(staging_pool_.size()); }
  int64_t gathers() const { return gathers_; }
  // Its buffers (memory_breakdown.h): params16.flat (stages 0-2), params16.partition (stage
  // 3; the host with parameter offload), params16.persistent, params16.gathered (stage 3's
  // buckets gathered or in flight now, persistent ones left out), params16.staging.
  void add_memory(MemoryBreakdown& m) const;
  const std::vector<at::Tensor>& params() const { return params_; }
  const std::vector<int64_t>& param_shape(size_t i) const { return param_shapes_.at(i); }

 private:
  // Fills `whole` (a bucket) with every rank's `mine` (its chunk): an all-gather, or a copy
  // with one partition (an empty Work then).
  comm::Work gather_chunks(at::Tensor whole, const at::Tensor& mine);
  at::Tensor partition_chunk(const at::Tensor& partition, int b) const;
  // Parameter offload: a copy of host chunk `chunk` on the training device, in a staging
  // buffer (kept in `holder` until the gather using it is done), or the chunk itself.
  at::Tensor bring_up(const at::Tensor& chunk, at::Tensor& holder, bool blocking = false);
  void give_back(at::Tensor& holder);  // the staging buffer back to the pool
  // Parameter NVMe offload.
  bool swapped(int b) const { return swap_ && swap_->swapped(b); }
  // Until a buffer is available: finishes the oldest gather in flight that holds one.
  void make_room();
  // The 16-bit partition laid out by `l` (the swapper's) into `into` (any type and device),
  // read from memory and files; and the other way, values (laid out by layout_) kept in
  // host memory and files made for layout_ (parameter offload).
  void read_partition16(const FlatLayout& l, at::Tensor& into);
  void keep_partition16(const at::Tensor& values);
  // b's chunk written from `values` (any device and type) to where it lives.
  void store_chunk(int b, const at::Tensor& values);
  // A swap buffer as a gather's input on the training device (through a staging buffer on a GPU).
  at::Tensor swap_up(const at::Tensor& host, at::Tensor& holder);
  void let_go_swap(int b);  // the gather of b lets its swap buffer go

  const FlatLayout& layout_;
  std::shared_ptr<comm::ProcessGroup> group_;
  std::vector<at::Tensor> params_;
  std::vector<std::vector<int64_t>> param_shapes_;
  at::Tensor flat_params_;  // stages 0-2
  at::Tensor part16_;       // stage 3: this rank's 16-bit chunks, laid out as its partition (NVMe:
                            // its head, the buckets kept in memory)
  at::TensorOptions device_options_;  // the training device and type (stage 3's buffers)
  ParamOffloadOptions offload_;
  std::vector<at::Tensor> staging_pool_;  // every staging buffer made (parameter offload)
  std::vector<bool> staging_busy_;
  int64_t staged_gathers_ = 0;
  struct Gathered {  // stage 3, per bucket
    BucketState state = BucketState::kRest;
    bool persistent = false;
    at::Tensor buffer;  // the whole bucket while in flight or gathered
    comm::Work work;
    at::Tensor staging;      // parameter offload: the staging buffer this gather's chunk came up in
    bool swap_held = false;  // NVMe: the gather holds the chunk's swap buffer
  };
  std::vector<Gathered> buckets16_;
  int64_t live_ = 0, peak_live_ = 0;
  int64_t gathers_ = 0;
  std::unique_ptr<ParamSwapper> swap_;  // parameter NVMe offload
  std::deque<int> swap_holders_;        // buckets whose gather in flight holds a swap buffer
  std::vector<comm::Work> published_;   // per bucket: its deferred all-gather, until waited for
  int pending_publishes_ = 0;
};

}  // namespace dscpp::zero
