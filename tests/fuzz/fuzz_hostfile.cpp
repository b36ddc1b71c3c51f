// parse_hostfile on arbitrary bytes: it either throws HostfileError or returns hosts whose
// names are non-empty printable text without white space, distinct, with slot counts the
// reader allows. Anything else (a crash, another exception, a NUL in a name) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include "hostfile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > dscpp::launcher::kMaxHostfileBytes) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const dscpp::launcher::ResourcePool pool = dscpp::launcher::parse_hostfile(text, "fuzz");
    std::set<std::string> seen;
    for (const auto& [host, slots] : pool) {
      if (host.empty() || slots < 0 || slots > 1000000 || !seen.insert(host).second) std::abort();
      for (unsigned char c : host)
        if (c <= 0x20 || c == 0x7f) std::abort();
    }
  } catch (const dscpp::launcher::HostfileError&) {
  }
  return 0;
}
