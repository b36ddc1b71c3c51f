// DeepSpeed's ZeRO partitioning, for checkpoints. DeepSpeed lays a parameter group out flat in
// registration order (offsets[i], with optional per-parameter alignment padding) and rank r
// of W owns the contiguous range [r*P, (r+1)*P) of that buffer padded to a multiple of 2W;
// its file holds that range without the padding past the last element. Our FlatLayout
// (zero/flat_layout.h) orders and splits the buffer differently, so a checkpoint re-maps
// every rank's elements between the two. These functions do it for any world sizes on
// either side: that is also how a checkpoint of N ranks loads onto M.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/zero/flat_layout.h"

namespace dscpp::checkpoint {

//
// Stage 3 partitions each parameter on its own instead: rank r holds elements
// [r*c, min((r+1)*c, numel)) of a parameter of numel elements, c = ceil(numel / W), and its
// file (fp32_flat_groups) lays those slices end to end, each padded to c.
struct DsLayout {
  std::vector<int64_t> numels;   // registration order
  std::vector<int64_t> offsets;  // stages 1-2: each parameter's first element in the buffer
  int64_t total = 0;             // elements with content (past the last parameter: padding)
  int world_size = 1;
  int64_t partition = 0;       // P: elements per rank, padding included
  bool per_parameter = false;  // stage 3's layout

  // numels in registration order; paddings: DeepSpeed's per-parameter alignment padding
  // (PARAM_ALIGNMENT_PADDINGS; empty means none).
  static DsLayout build(const std::vector<int64_t>& numels, int world_size,
                        const std::vector<int64_t>& paddings = {});
  static DsLayout build_stage3(const std::vector<int64_t>& numels, int world_size);
  // Stages 1-2: [begin, end) of rank r's range that its file holds (the padding left out).
  int64_t begin(int r) const { return per_parameter ? 0 : r * partition; }
  int64_t end(int r) const;
  // Elements of rank r's file.
  int64_t held(int r) const { return per_parameter ? partition : end(r) - begin(r); }

  // One run of a parameter's elements in rank r's file: elements [first, first + count) of
  // parameter `param` sit at file position `at`.
  struct Segment {
    int param;
    int64_t first, count, at;
  };
  std::vector<Segment> segments(int r) const;
};

// This rank's DeepSpeed partition of a tensor laid out as our partition (the fp32 master or
// one optimizer state): a CPU fp32 tensor of ds.end(r) - ds.begin(r) elements. Collective:
// every rank of `group` calls it with the same layouts; each bucket is all-gathered once.
at::Tensor to_ds_partition(const zero::FlatLayout& ours, const DsLayout& ds,
                           const at::Tensor& partition, comm::ProcessGroup& group);

// Copies what `file_rank`'s DeepSpeed partition `saved` holds of `rank`'s own partition under
// our layout into `partition` (ours; any device). Elements of other files are left alone,
// so calling it for every saved file fills the partition. No communication.
void from_ds_partition(const zero::FlatLayout& ours, int rank, const DsLayout& ds, int file_rank,
                       const at::Tensor& saved, at::Tensor& partition);

// DeepSpeed's ZeRO 1-2 form of Muon's momentum_buffer (stage_1_and_2.py's
// _muon_momentum_buffer): rank r's file holds every parameter with elements in its partition r,
// whole, one after the other (a parameter that straddles two partitions is in both files), for
// Newton-Schulz needs the whole matrix. The parameters of file r, in order:
std::vector<int> ds_whole_params(const DsLayout& ds, int r);
// This rank's file of such a state, from the state laid out as our partition: a CPU fp32 tensor.
// Collective as to_ds_partition.
at::Tensor to_ds_whole_params(const zero::FlatLayout& ours, const DsLayout& ds,
                              const at::Tensor& partition, comm::ProcessGroup& group);
// Copies what file `file_rank` (`saved`, that form) holds of `rank`'s partition under our layout
// into `partition`, as from_ds_partition does.
void from_ds_whole_params(const zero::FlatLayout& ours, int rank, const DsLayout& ds, int file_rank,
                          const at::Tensor& saved, at::Tensor& partition);

}  // namespace dscpp::checkpoint
