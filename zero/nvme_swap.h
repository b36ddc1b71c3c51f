// ZeRO-Infinity's optimizer swapper (offload_optimizer.device = "nvme"): the host part of the
// master partition (the fp32 master and each optimizer state, `numel` fp32 elements each)
// lives in files, one per tensor, in DeepSpeed's folder for them,
// <nvme_path>/zero_stage_<stage>/optimizer/rank<global rank>/<name>.tensor.swp. In memory
// there are only buffer_count buffer sets, each as large as the largest planned range.
// The step is pipelined as DeepSpeed's PipelinedOptimizerSwapper: plan() the ranges (the CPU
// optimizer's sub-groups, in step order), then for each one acquire() (its read was issued
// ahead, while earlier ranges were stepped), step it in the returned buffers, release() (its
// write is issued and runs while the next ranges are stepped), and finish() at the end.
// read_all / write_all give and take a whole tensor (checkpoints). Files and the
// folders made for them are removed when the swapper goes.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/zero/nvme_file.h"

namespace dscpp::zero {

struct NvmeOptions {
  bool enabled = false;
  std::string path;                                                   // nvme_path
  std::string key = "zero_optimization.offload_optimizer.nvme_path";  // named in errors
  int stage = 1;
  int rank = 0;  // the global rank: the folder's name
  int64_t buffer_count = 4;
  bool pin_memory = false;  // page-locked buffers (only where a GPU is)
  AioOptions aio;
};

// The swap folders both swappers share. check_nvme_path: nvme_path exists, is a directory
// and is writable (else an Error naming `key` and the path). make_swap_folder: nvme_path/parts...
// made where missing (an Error naming the folder where that fails; a parent another rank removes
// meanwhile is made again); returns it.
// remove_swap_folder: the folder, then each of its `levels` parents where empty (another rank's
// folder may still be beside ours: the last to go removes them, whoever made them).
void check_nvme_path(const std::string& path, const std::string& key);
std::string make_swap_folder(const std::string& path, const std::string& key,
                             const std::vector<std::string>& parts);
void remove_swap_folder(const std::string& folder, int levels);

class NvmeSwapper {
 public:
  // Checks nvme_path (exists, a directory, writable: else an Error naming it) and makes the
  // rank's folder.
  NvmeSwapper(const NvmeOptions& options, int64_t numel);
  ~NvmeSwapper();

  // A new tensor's file, every element `value` (disk space reserved now).
  void add(const std::string& name, float value = 0.0f);
  // Elements [begin, end) of a tensor set to value (Adagrad's initial sum, group by group).
  void fill(const std::string& name, int64_t begin, int64_t end, float value);
  int64_t numel() const { return numel_; }
  bool has(const std::string& name) const { return files_.count(name) > 0; }
  at::Tensor read_all(const std::string& name);
  void write_all(const std::string& name, const at::Tensor& values);

  void plan(std::vector<std::pair<int64_t, int64_t>> ranges);
  // The next planned range, which must be [begin, end): every tensor's elements there, in a
  // buffer the caller may update in place.
  std::map<std::string, at::Tensor> acquire(int64_t begin, int64_t end);
  void release();
  void finish();
  bool planned() const { return !ranges_.empty(); }

  const std::string& folder() const { return folder_; }
  int64_t bytes_on_disk() const;  // what the files hold
  int64_t buffer_numel() const;   // elements of all buffers in memory

 private:
  struct Slot {
    std::map<std::string, at::Tensor> buffers;
    std::vector<std::pair<NvmeFile*, int64_t>> reads, writes;  // tickets in flight
  };
  void issue_read(size_t j);
  void wait(std::vector<std::pair<NvmeFile*, int64_t>>& tickets);

  NvmeOptions options_;
  int64_t numel_;
  std::string folder_;
  std::map<std::string, std::unique_ptr<NvmeFile>> files_;
  std::vector<Slot> slots_;
  int64_t slot_numel_ = 0;
  std::vector<std::pair<int64_t, int64_t>> ranges_;
  size_t cursor_ = 0, issued_ = 0;
};

}  // namespace dscpp::zero
