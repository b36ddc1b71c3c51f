// check_master_addr: see master_addr.h.
#include "master_addr.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "errors.h"

namespace dscpp::launcher {

void check_master_addr(const std::string& addr) {
  auto refuse = [&](const std::string& why) {
    throw UserError(fmt::format("the master address '{}' (--master_addr) {}", addr, why));
  };
  if (addr.empty()) refuse("is empty");
  // inet_aton's forms (127.1 included) are what getaddrinfo reads as IPv4 without a lookup.
  if (addr.find_first_not_of("0123456789.") == std::string::npos) {
    in_addr ipv4{};
    if (::inet_aton(addr.c_str(), &ipv4) == 0)
      refuse(
          "is not an IPv4 address (each part is a number from 0 to 255), and no host name "
          "is all digits and dots");
    return;
  }
  std::string lower = addr;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower.back() == '.') lower.pop_back();
  const std::string invalid = ".invalid";
  if (lower == "invalid" ||
      (lower.size() > invalid.size() &&
       lower.compare(lower.size() - invalid.size(), invalid.size(), invalid) == 0))
    refuse("is under the top-level domain .invalid, which names no host (RFC 6761)");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(addr.c_str(), nullptr, &hints, &found);
  if (found != nullptr) ::freeaddrinfo(found);
  if (rc != 0) refuse(fmt::format("cannot be resolved: {}", ::gai_strerror(rc)));
}

}  // namespace dscpp::launcher
