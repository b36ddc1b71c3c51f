// open_regular_file and read_bounded_file: POSIX calls, each failure a DataError.
#include "dscpp/data/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dscpp/data/data_error.h"

namespace dscpp::data {

int open_regular_file(const std::string& path, size_t& size) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever. It
  // changes nothing for a regular file, the only kind accepted below.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw DataError(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    std::string e = std::strerror(errno);
    ::close(fd);
    throw DataError(path, "cannot stat: " + e);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw DataError(path, S_ISDIR(st.st_mode) ? "is a directory, not a file"
                                              : "is not a regular file (a FIFO, socket or device)");
  }
  size = static_cast<size_t>(st.st_size);
  return fd;
}

std::string read_bounded_file(const std::string& path, const char* what, size_t max_bytes) {
  size_t size = 0;
  int fd = open_regular_file(path, size);
  if (size > max_bytes) {
    ::close(fd);
    throw DataError(path, "the " + std::string(what) + " file has " + std::to_string(size) +
                              " bytes, more than the " + std::to_string(max_bytes) + " a " + what +
                              " file may have");
  }
  std::string out(size, '\0');
  size_t got = 0;
  while (got < size) {
    ssize_t n = ::read(fd, out.data() + got, size - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::string e = std::strerror(errno);
      ::close(fd);
      throw DataError(path, "cannot read the " + std::string(what) + " file: " + e);
    }
    if (n == 0) break;  // the file shrank while we read: take what is there
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

}  // namespace dscpp::data
