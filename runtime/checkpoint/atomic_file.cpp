// AtomicFile: see atomic_file.h.
#include "dscpp/runtime/checkpoint/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "dscpp/runtime/checkpoint/checkpoint_error.h"

namespace dscpp::checkpoint {
namespace {

constexpr size_t kBuffer = 1 << 20;

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail("cannot create", errno);
  buffer_.reserve(kBuffer);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(tmp_.c_str());
}

void AtomicFile::fail(const char* what, int error) {
  // The caller's exception unwinds through the destructor, which removes the .tmp.
  throw CheckpointError(std::string(what) + " '" + tmp_ + "': " + std::strerror(error));
}

void AtomicFile::write(const void* data, size_t n) {
  if (fd_ < 0) throw CheckpointError("write to '" + tmp_ + "' after it was committed");
  const char* p = static_cast<const char*>(data);
  if (buffer_.size() + n <= kBuffer) {
    buffer_.append(p, n);
    return;
  }
  flush();
  size_t done = 0;
  while (done < n) {  // a large record goes straight through, without a copy
    const ssize_t w = ::write(fd_, p + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) fail("cannot write", errno);
    done += static_cast<size_t>(w);
  }
}

void AtomicFile::flush() {
  size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t w = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) fail("cannot write", errno);
    done += static_cast<size_t>(w);
  }
  buffer_.clear();
}

void AtomicFile::set_mode(unsigned mode) {
  if (fd_ >= 0 && ::fchmod(fd_, static_cast<mode_t>(mode)) != 0) fail("cannot chmod", errno);
}

void AtomicFile::commit() {
  if (fd_ < 0) throw CheckpointError("'" + tmp_ + "' committed twice");
  flush();
  if (::fsync(fd_) != 0) fail("cannot sync", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("cannot close", errno);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int error = errno;
    throw CheckpointError("cannot rename '" + tmp_ + "' to '" + path_ +
                          "': " + std::strerror(error));
  }
  committed_ = true;
  // The rename itself is durable once the folder is synced.
  std::string dir = std::filesystem::path(path_).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace dscpp::checkpoint
