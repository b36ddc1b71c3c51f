// ZeRO-Infinity's parameter swapper (offload_param.device = "nvme", stage 3; DeepSpeed's
// AsyncPartitionedParameterSwapper): this rank's 16-bit chunk of each swapped bucket lives in a
// file of its own, <nvme_path>/zero_stage_3/<dtype>params/rank<global
// rank>/<bucket>_param.tensor.swp (DeepSpeed's folder; its id is the parameter's, ours the
// bucket's, our unit of gathering), and enters host memory only through at most buffer_count
// buffers (each as large as the largest swapped chunk, at most buffer_size elements). A buffer
// holds one chunk: read into it ahead of its gather (read_ahead) or when the gather needs it
// (acquire), held until the gather has taken it (let_go); or an updated chunk written from it
// (stage_write, write), free again once the write has completed. A chunk's read waits for its last
// write. When every buffer is taken, the oldest write is waited for, else the last read ahead is
// given up (read again when needed); buffers held by gathers only come back through let_go. Files
// and the folders made for them are removed when the swapper goes.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "dscpp/zero/nvme_file.h"

namespace dscpp::zero {

struct ParamNvmeOptions {
  bool enabled = false;
  std::string path;  // offload_param.nvme_path
  int rank = 0;      // the global rank: the folder's name
  int64_t buffer_count = 5;
  int64_t buffer_size = 100000000;  // elements per buffer
  // Elements of the partition kept in host memory instead (whole buckets, from its start, as
  // DeepSpeed keeps its first max_in_cpu elements): ParamStore's choice of what is swapped.
  int64_t max_in_cpu = 1000000000;
  bool pin_memory = false;  // page-locked buffers (only where a GPU is)
  AioOptions aio;
};

class ParamSwapper {
 public:
  // chunks[b]: elements of bucket b's chunk; swapped[b]: whether it lives in a file (made now,
  // its disk space reserved; its contents are what the first write puts there). dtype: the
  // parameters' training type. Errors name the offload_param key or the file.
  ParamSwapper(const ParamNvmeOptions& options, at::ScalarType dtype, std::vector<int64_t> chunks,
               std::vector<bool> swapped);
  ~ParamSwapper();
  ParamSwapper(const ParamSwapper&) = delete;
  ParamSwapper& operator=(const ParamSwapper&) = delete;

  bool swapped(int b) const { return files_.at(b) != nullptr; }
  // Whether b has a buffer now (read ahead, held, or staged for a write).
  bool has_buffer(int b) const { return slot_of_.at(b) >= 0; }
  // Whether a buffer can be had without a gather letting one go.
  bool buffer_available() const;
  // Issues b's read into a buffer that is free or not made yet (never waits); false when
  // there is none. b must be swapped and have no buffer.
  bool read_ahead(int b);
  // b's chunk in host memory (its read issued now unless it was ahead; needs
  // buffer_available() then), waited for. Held (counted) until as many let_go(b).
  at::Tensor acquire(int b);
  void let_go(int b);
  // A buffer for b's new values (the same one until write(b); a read ahead of b is given up).
  at::Tensor stage_write(int b);
  // Issues the write of b's staged buffer; the buffer is free again once it has completed.
  void write(int b);
  // Every read ahead not acquired given up (their buffers free), every write completed.
  void drop_reads_ahead();
  void wait_writes();
  // Moves queued pieces of reads and writes into the kernel without blocking.
  void progress();

  const std::string& folder() const { return folder_; }
  std::string file_of(int b) const;
  int64_t bytes_on_disk() const;
  // Host memory: elements of the buffers made (at most buffer_count x buffer_size), buffers
  // in use now and at most at once since construction.
  int64_t buffer_numel() const;
  int buffers_in_use() const;
  int peak_buffers_in_use() const { return peak_in_use_; }
  // Reads issued, and those issued ahead that a gather then used; writes issued.
  int64_t reads() const { return reads_; }
  int64_t reads_ahead_used() const { return reads_ahead_used_; }
  int64_t writes() const { return writes_; }

 private:
  enum class Use { kFree, kAhead, kHeld, kStaged, kWriting };
  struct Slot {
    at::Tensor memory;
    Use use = Use::kFree;
    int bucket = -1;
    int64_t ticket = -1;  // the read or write in flight
    int holds = 0;
    bool read_ahead = false;  // its read was issued by read_ahead (counted when acquired)
    int64_t order = 0;        // when the read ahead or the write was issued
  };
  int take();            // a buffer for a new use, waiting for a write or giving up a read ahead
  void settle(Slot& s);  // waits for the slot's transfer in flight
  void free(Slot& s);
  void count_use();
  at::Tensor chunk_of(Slot& s, int b) const;

  ParamNvmeOptions options_;
  at::ScalarType dtype_;
  int64_t element_ = 2;
  std::vector<int64_t> chunks_;
  std::string folder_;
  std::vector<std::unique_ptr<NvmeFile>> files_;  // null: not swapped
  std::vector<int> slot_of_;                      // per bucket: its buffer, or -1
  std::vector<Slot> slots_;
  int64_t slot_numel_ = 0;
  int64_t issued_ = 0;
  int peak_in_use_ = 0;
  int64_t reads_ = 0, reads_ahead_used_ = 0, writes_ = 0;
};

}  // namespace dscpp::zero
