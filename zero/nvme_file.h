// One swap file of ZeRO-Infinity (offload device "nvme"), read and written asynchronously
// through io_uring (liburing). A request is cut into pieces of at most aio.block_size bytes;
// at most aio.queue_depth pieces are in flight at once; aio.single_submit submits each piece
// as it is queued instead of a batch at a time. A piece the kernel completes short is
// resubmitted for the rest; a read that meets the end of the file, or any error the kernel
// returns (ENOSPC on a full disk, EIO, ...), throws dscpp::Error naming the file, the offset
// and the reason. Buffered I/O (no O_DIRECT: a tmpfs or any file system serves).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace dscpp::zero {

// DeepSpeed's "aio" section, the keys that map onto io_uring.
struct AioOptions {
  int64_t block_size = 1048576;  // bytes per submitted piece
  int64_t queue_depth = 8;       // pieces in flight, and the ring's size
  bool single_submit = false;    // submit each piece alone (true) or a batch at a time
};

class NvmeFile {
 public:
  // Opens `path` for reading and writing. create: a new file (truncated), whose `bytes` are
  // reserved on the disk now (a disk too small fails here, naming the file) and which is
  // removed when this object goes. Otherwise the file must exist and stays.
  NvmeFile(std::string path, AioOptions aio, bool create, int64_t bytes = 0);
  ~NvmeFile();
  NvmeFile(const NvmeFile&) = delete;
  NvmeFile& operator=(const NvmeFile&) = delete;

  // Queue a transfer of `bytes` between memory and the file at byte `offset`; the memory
  // must stay valid (and, for a write, unchanged) until wait(ticket) returns.
  int64_t write(int64_t offset, const void* src, int64_t bytes);
  int64_t read(int64_t offset, void* dst, int64_t bytes);
  // Blocks until every piece of the ticket has completed; throws the first error among them.
  void wait(int64_t ticket);
  void wait_all();
  // Reaps what has completed and moves queued pieces into the ring, without blocking (pieces
  // beyond queue_depth wait for this, or for a wait, to be submitted).
  void progress();

  const std::string& path() const { return path_; }

 private:
  struct Ring;
  std::string path_;
  bool owned_;
  std::unique_ptr<Ring> ring_;
};

}  // namespace dscpp::zero
