// AtomicFile: how every checkpoint file is written. The bytes go to `path + ".tmp"`; commit()
// syncs them, renames the file over `path` and syncs the folder, so a reader (or a crash)
// sees the old file or the whole new one. A failed write (a full disk: ENOSPC, a file-size
// limit: EFBIG, an I/O error) throws CheckpointError naming the file and strerror, and a file
// never committed is removed: no `.tmp` is left behind by a failed or abandoned save.
#pragma once

#include <cstddef>
#include <string>

namespace dscpp::checkpoint {

class AtomicFile {
 public:
  // Creates (or truncates) `path + ".tmp"`; throws CheckpointError when it cannot.
  explicit AtomicFile(std::string path);
  ~AtomicFile();  // removes the .tmp unless committed; never throws
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends; small writes are gathered into one buffer of 1 MiB. Throws CheckpointError.
  void write(const void* data, size_t n);
  // Sets the file's permission bits (fchmod; 0644 less the umask until then).
  void set_mode(unsigned mode);
  // Flushes, fsyncs, closes and renames over the final path, then fsyncs the folder.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& tmp_path() const { return tmp_; }

 private:
  void flush();
  [[noreturn]] void fail(const char* what, int error);

  std::string path_, tmp_;
  int fd_ = -1;
  bool committed_ = false;
  std::string buffer_;
};

}  // namespace dscpp::checkpoint
