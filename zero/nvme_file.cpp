// NvmeFile: see nvme_file.h.
#include "dscpp/zero/nvme_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <unordered_map>

#include "dscpp/error.h"

namespace dscpp::zero {

namespace {

std::string reason(int err) {
  return std::strerror(err);
}

}  // namespace

struct NvmeFile::Ring {
  struct Piece {
    int64_t ticket;
    int64_t offset;  // in the file
    char* memory;
    int64_t bytes;
    bool read;
  };
  io_uring ring{};
  int fd = -1;
  AioOptions aio;
  const std::string* path;
  uint64_t next_id = 0;
  int64_t next_ticket = 0;
  std::unordered_map<uint64_t, Piece> pieces;  // queued or in flight, by id
  std::deque<uint64_t> pending;                // queued, not yet in an SQE
  int64_t in_flight = 0;
  std::map<int64_t, int64_t> outstanding;  // pieces not completed, by ticket
  std::map<int64_t, std::string> errors;   // the first error of a ticket

  int64_t queue(int64_t offset, char* memory, int64_t bytes, bool read) {
    if (offset < 0 || bytes < 0)
      throw Error(fmt::format("NVMe swap file '{}': a transfer of {} bytes at offset {}", *path,
                              bytes, offset));
    const int64_t ticket = next_ticket++;
    outstanding[ticket] = 0;
    const int64_t block = std::max<int64_t>(1, aio.block_size);
    for (int64_t done = 0; done < bytes; done += block) {
      const uint64_t id = next_id++;
      pieces[id] = {ticket, offset + done, memory + done, std::min(block, bytes - done), read};
      pending.push_back(id);
      ++outstanding[ticket];
    }
    pump();
    return ticket;
  }

  // Moves queued pieces into the ring while it has room for them.
  void pump() {
    bool queued = false;
    while (!pending.empty() && in_flight < aio.queue_depth) {
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (!sqe) {
        submit();
        sqe = io_uring_get_sqe(&ring);
        if (!sqe) break;
      }
      const uint64_t id = pending.front();
      pending.pop_front();
      const Piece& p = pieces.at(id);
      const auto n = static_cast<unsigned>(p.bytes);
      if (p.read) {
        io_uring_prep_read(sqe, fd, p.memory, n, static_cast<uint64_t>(p.offset));
      } else {
        io_uring_prep_write(sqe, fd, p.memory, n, static_cast<uint64_t>(p.offset));
      }
      io_uring_sqe_set_data64(sqe, id);
      ++in_flight;
      queued = true;
      if (aio.single_submit) submit();
    }
    if (queued && !aio.single_submit) submit();
  }

  void submit() {
    int r;
    do {
      r = io_uring_submit(&ring);
    } while (r == -EINTR);
    if (r < 0)
      throw Error(
          fmt::format("NVMe swap file '{}': io_uring_submit failed: {}", *path, reason(-r)));
  }

  // Waits for one completion and accounts for it.
  void reap() {
    io_uring_cqe* cqe = nullptr;
    int r;
    do {
      r = io_uring_wait_cqe(&ring, &cqe);
    } while (r == -EINTR);
    if (r < 0)
      throw Error(
          fmt::format("NVMe swap file '{}': waiting for io_uring failed: {}", *path, reason(-r)));
    const uint64_t id = io_uring_cqe_get_data64(cqe);
    const int res = cqe->res;
    io_uring_cqe_seen(&ring, cqe);
    --in_flight;
    Piece& p = pieces.at(id);
    const char* what = p.read ? "reading" : "writing";
    auto fail = [&](const std::string& why) {
      errors.emplace(p.ticket, fmt::format("NVMe swap file '{}': {} {} bytes at offset {}: {}",
                                           *path, what, p.bytes, p.offset, why));
      --outstanding[p.ticket];
      pieces.erase(id);
    };
    if (res == -EAGAIN || res == -EINTR) {
      pending.push_front(id);
    } else if (res < 0) {
      fail(reason(-res) + (res == -ENOSPC ? " (the disk under nvme_path is full)" : ""));
    } else if (res == 0 && p.bytes > 0) {
      fail(p.read ? "short read: the file ends there" : "the kernel wrote nothing");
    } else if (res < p.bytes) {
      // A short transfer: the rest goes again.
      p.offset += res;
      p.memory += res;
      p.bytes -= res;
      pending.push_front(id);
    } else {
      --outstanding[p.ticket];
      pieces.erase(id);
    }
  }

  void wait(int64_t ticket) {
    auto it = outstanding.find(ticket);
    if (it == outstanding.end()) return;
    while (it->second > 0) {
      pump();
      reap();
    }
    outstanding.erase(it);
    auto e = errors.find(ticket);
    if (e != errors.end()) {
      const std::string message = e->second;
      errors.erase(e);
      throw Error(message);
    }
  }

  void progress() {
    io_uring_cqe* cqe = nullptr;
    while (in_flight > 0 && io_uring_peek_cqe(&ring, &cqe) == 0 && cqe) {
      reap();
      cqe = nullptr;
    }
    pump();
  }

  // Everything in flight completes (the destructor: errors dropped, memory must not be
  // touched by the kernel after we go).
  void drain() noexcept {
    pending.clear();
    while (in_flight > 0) {
      io_uring_cqe* cqe = nullptr;
      if (io_uring_wait_cqe(&ring, &cqe) < 0) break;
      io_uring_cqe_seen(&ring, cqe);
      --in_flight;
    }
  }
};

NvmeFile::NvmeFile(std::string path, AioOptions aio, bool create, int64_t bytes)
    : path_(std::move(path)), owned_(create), ring_(std::make_unique<Ring>()) {
  if (aio.queue_depth < 1) aio.queue_depth = 1;
  ring_->aio = aio;
  ring_->path = &path_;
  const int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT | O_TRUNC : 0);
  ring_->fd = ::open(path_.c_str(), flags, 0600);
  if (ring_->fd < 0)
    throw Error(fmt::format("NVMe swap file '{}': cannot open it: {}", path_, reason(errno)));
  if (create && bytes > 0) {
    // Reserved now, so that a disk too small says so at start-up, not mid-training.
    int r = ::posix_fallocate(ring_->fd, 0, bytes);
    if (r == EOPNOTSUPP || r == EINVAL) r = ::ftruncate(ring_->fd, bytes) == 0 ? 0 : errno;
    if (r != 0) {
      ::close(ring_->fd);
      ::unlink(path_.c_str());
      throw Error(fmt::format("NVMe swap file '{}': cannot reserve {} bytes: {}{}", path_, bytes,
                              reason(r),
                              r == ENOSPC ? " (the disk under nvme_path is too small)" : ""));
    }
  }
  const int r = io_uring_queue_init(static_cast<unsigned>(std::min<int64_t>(aio.queue_depth, 4096)),
                                    &ring_->ring, 0);
  if (r < 0) {
    ::close(ring_->fd);
    if (owned_) ::unlink(path_.c_str());
    throw Error(fmt::format("NVMe swap file '{}': io_uring unavailable: {}", path_, reason(-r)));
  }
}

NvmeFile::~NvmeFile() {
  ring_->drain();
  io_uring_queue_exit(&ring_->ring);
  ::close(ring_->fd);
  if (owned_) ::unlink(path_.c_str());
}

int64_t NvmeFile::write(int64_t offset, const void* src, int64_t bytes) {
  return ring_->queue(offset, static_cast<char*>(const_cast<void*>(src)), bytes, false);
}

int64_t NvmeFile::read(int64_t offset, void* dst, int64_t bytes) {
  return ring_->queue(offset, static_cast<char*>(dst), bytes, true);
}

void NvmeFile::wait(int64_t ticket) {
  ring_->wait(ticket);
}

void NvmeFile::progress() {
  ring_->progress();
}

void NvmeFile::wait_all() {
  while (!ring_->outstanding.empty()) ring_->wait(ring_->outstanding.begin()->first);
}

}  // namespace dscpp::zero
