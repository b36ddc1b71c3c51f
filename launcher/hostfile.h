// Hostfile parsing, MPI style as DeepSpeed reads it: one `host slots=N` per line, `#`
// comments and blank lines skipped. Host order is kept because it defines how global ranks
// are numbered across nodes. Errors name the offending line so the user can fix the file.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "errors.h"

namespace dscpp::launcher {

// Hosts in file order with their slot counts.
using ResourcePool = std::vector<std::pair<std::string, int>>;

class HostfileError : public UserError {
 public:
  using UserError::UserError;
};

// A hostfile of a million bytes already names tens of thousands of hosts; anything larger is
// a mistake (a log, a binary) and is refused before it is read.
inline constexpr size_t kMaxHostfileBytes = 1 << 20;

// Parses hostfile text. `origin` names the source in error messages (usually the path).
// Throws HostfileError on a malformed line, a duplicate host, a host name with a control
// byte (NUL, ESC, DEL, ...: ssh would cut or misread it), or a file with no hosts; the
// message is `origin:line[:column]: what`.
ResourcePool parse_hostfile(const std::string& text, const std::string& origin = "hostfile");

// Reads and parses `path`. Returns nullopt when the file does not exist (DeepSpeed then
// runs on local resources only); throws HostfileError when it exists but cannot be used,
// also when it holds more than kMaxHostfileBytes.
std::optional<ResourcePool> read_hostfile(const std::string& path);

}  // namespace dscpp::launcher
