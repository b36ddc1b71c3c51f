// check_master_addr: addresses that name no host are refused with the address and the reason;
// none of the refusals here needs the network (the form, or RFC 6761's .invalid), and the
// accepted ones are numeric, which getaddrinfo reads without a lookup.
#include <gtest/gtest.h>

#include "errors.h"
#include "master_addr.h"

namespace dscpp::launcher {
namespace {

std::string refusal(const std::string& addr) {
  try {
    check_master_addr(addr);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(MasterAddr, AddressesThatNameNoHostAreRefusedByName) {
  const std::string form =
      "is not an IPv4 address (each part is a number from 0 to 255), and no host name is all "
      "digits and dots";
  for (const std::string addr : {"256.1.1.1", "1.2.3.4.5", "10.0.0.300", "1..2", "."})
    EXPECT_EQ(refusal(addr), "the master address '" + addr + "' (--master_addr) " + form);
  const std::string invalid =
      "is under the top-level domain .invalid, which names no host (RFC 6761)";
  for (const std::string addr : {"node7.invalid", "a.b.INVALID", "x.invalid.", "invalid"})
    EXPECT_EQ(refusal(addr), "the master address '" + addr + "' (--master_addr) " + invalid);
  EXPECT_EQ(refusal(""), "the master address '' (--master_addr) is empty");
}

TEST(MasterAddr, NumericAddressesAreAccepted) {
  for (const std::string addr : {"127.0.0.1", "127.1", "10.0.0.1", "::1", "0.0.0.0"})
    EXPECT_EQ(refusal(addr), "") << addr;
}

}  // namespace
}  // namespace dscpp::launcher
