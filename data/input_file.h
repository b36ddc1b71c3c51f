// Opening the data readers' input files safely: only regular files (a FIFO or a device would
// block or never end), without blocking on open, and read whole only under a size bound.
// Errors are DataErrors naming the file.
#pragma once

#include <cstddef>
#include <string>

namespace dscpp::data {

// The file's descriptor (O_RDONLY | O_CLOEXEC) and, in `size`, its size. The caller closes it.
int open_regular_file(const std::string& path, size_t& size);

// The whole file; refused when it is larger than `max_bytes` (checked before reading).
// `what` names the file's role in messages ("vocabulary").
std::string read_bounded_file(const std::string& path, const char* what, size_t max_bytes);

}  // namespace dscpp::data
