// The master address checked before any rank starts. An address that names no host would
// otherwise show only when every rank's rendezvous gives up, twice the collective timeout
// later (20 minutes by default), after a screen of c10d warnings.
#pragma once

#include <string>

namespace dscpp::launcher {

// Throws UserError naming `addr` and why it cannot be used: digits and dots that are no IPv4
// address (256.1.1.1; no host name is all digits and dots, so it is never looked up), a name
// under the reserved top-level domain .invalid (RFC 6761: never looked up), or a name the
// system's resolver (getaddrinfo, as the ranks' TCPStore and Gloo use) does not resolve.
void check_master_addr(const std::string& addr);

}  // namespace dscpp::launcher
