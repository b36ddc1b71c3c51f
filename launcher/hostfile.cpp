#include "hostfile.h"

#include <fmt/format.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "text.h"

namespace dscpp::launcher {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

// Matches DeepSpeed's `^(\S+)\s+slots=(\d+)`; anything after the slot count (such as an
// MPI `max_slots=` field) is tolerated as it is there, but the count itself must be a
// whole token so `slots=4x` is not silently read as 4.
bool parse_line(const std::string& line, std::string& host, int& slots) {
  size_t i = 0;
  while (i < line.size() && !is_space(line[i])) ++i;
  if (i == 0 || i == line.size()) return false;
  host = line.substr(0, i);
  while (i < line.size() && is_space(line[i])) ++i;
  static const std::string kSlots = "slots=";
  if (line.compare(i, kSlots.size(), kSlots) != 0) return false;
  i += kSlots.size();
  size_t digits_begin = i;
  long long value = 0;
  while (i < line.size() && line[i] >= '0' && line[i] <= '9') {
    value = value * 10 + (line[i] - '0');
    if (value > 1000000) return false;
    ++i;
  }
  if (i == digits_begin || (i < line.size() && !is_space(line[i]))) return false;
  slots = static_cast<int>(value);
  return true;
}

}  // namespace

ResourcePool parse_hostfile(const std::string& text, const std::string& origin) {
  ResourcePool pool;
  std::istringstream in(text);
  std::string raw;
  int line_no = 0;
  while (std::getline(in, raw)) {
    ++line_no;
    const std::string line = trim(raw);
    if (line.empty() || line[0] == '#') continue;
    // Before parsing: a NUL would end the name that reaches ssh, an escape would rewrite
    // the terminal that shows our messages.
    for (size_t i = 0; i < raw.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(raw[i]);
      if ((c < 0x20 && !is_space(static_cast<char>(c))) || c == 0x7f) {
        throw HostfileError(fmt::format(
            "{}:{}:{}: control byte 0x{:02x} in the entry; host names are printable text", origin,
            line_no, i + 1, c));
      }
    }
    std::string host;
    int slots = 0;
    if (!parse_line(line, host, slots)) {
      throw HostfileError(
          fmt::format("{}:{}: bad entry '{}', expected 'HOST slots=N'", origin, line_no, line));
    }
    for (const auto& [known, unused] : pool) {
      if (known == host) {
        throw HostfileError(
            fmt::format("{}:{}: host '{}' is listed more than once", origin, line_no, host));
      }
    }
    pool.emplace_back(host, slots);
  }
  if (pool.empty()) {
    throw HostfileError(fmt::format("{}: no hosts found (expected lines 'HOST slots=N')", origin));
  }
  return pool;
}

std::optional<ResourcePool> read_hostfile(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::nullopt;
    throw HostfileError(fmt::format("cannot read hostfile {}: {}", path, std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) throw HostfileError(fmt::format("hostfile {} is a directory", path));
  if (S_ISREG(st.st_mode) && static_cast<size_t>(st.st_size) > kMaxHostfileBytes)
    throw HostfileError(fmt::format("hostfile {} is {} bytes, more than the {} a hostfile may have",
                                    path, st.st_size, kMaxHostfileBytes));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw HostfileError(fmt::format("cannot read hostfile {}", path));
  // Bounded read as well: a FIFO or /proc file reports no size.
  std::string text(kMaxHostfileBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxHostfileBytes)
    throw HostfileError(fmt::format("hostfile {}: more than the {} bytes a hostfile may have", path,
                                    kMaxHostfileBytes));
  return parse_hostfile(text, path);
}

}  // namespace dscpp::launcher
