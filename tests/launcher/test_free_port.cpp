// dscpp's `--master_port 0` (DeepSpeed's runner has none): one free port for every rank,
// held by the launcher while the ranks run, so that concurrent jobs never meet on one port.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <set>

#include "process_harness.h"

namespace dscpp::launcher::testing {
namespace {

// 0, or the errno of binding 0.0.0.0:port (then listening, as a store serving it would).
int bind_error(int port, bool reuse_address) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  const int on = 1;
  if (reuse_address) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  int error = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(fd, 1) != 0)
    error = errno;
  ::close(fd);
  return error;
}

// The one MASTER_PORT of n ranks that wrote their files in dir, or -1 when they disagree.
int port_of_ranks(const std::string& dir, int n) {
  std::set<std::string> ports;
  for (int r = 0; r < n; ++r) {
    const auto info = read_rank(dir, r);
    if (!info || !info->env.count("MASTER_PORT")) return -1;
    ports.insert(info->env.at("MASTER_PORT"));
  }
  return ports.size() == 1 ? std::stoi(*ports.begin()) : -1;
}

TEST(FreeMasterPort, EveryRankGetsOnePortHeldUntilTheJobEnds) {
  if (file_exists("/job/hostfile")) {
    GTEST_SKIP() << "/job/hostfile exists on this machine";
  }
  TempDir first, second, gate;
  const std::string go = gate / "go";
  auto start = [&](const TempDir& out) {
    return std::make_unique<Launch>(
        std::vector<std::string>{"--num_gpus", "3", "--master_port", "0", kFakeRank,
                                 "out=" + out.path(), "wait_file=" + go},
        std::map<std::string, std::string>{}, "/tmp");
  };
  auto a = start(first);
  auto b = start(second);
  ASSERT_TRUE(wait_for_ranks(first.path(), 3));
  ASSERT_TRUE(wait_for_ranks(second.path(), 3));
  const int port = port_of_ranks(first.path(), 3);
  const int other = port_of_ranks(second.path(), 3);
  ASSERT_GT(port, 0) << "the ranks of one launch got no port, 0, or different ports";
  ASSERT_GT(other, 0);
  EXPECT_NE(port, other) << "two launches at once were given one port";
  // Held: nothing binding without SO_REUSEADDR (nor the kernel's choice of a free port) can
  // take it, while rank 0's store, which binds with SO_REUSEADDR, can serve on it.
  EXPECT_EQ(bind_error(port, false), EADDRINUSE);
  EXPECT_EQ(bind_error(port, true), 0);
  write_file(go, "");
  EXPECT_EQ(a->wait().code, 0);
  EXPECT_EQ(b->wait().code, 0);
  EXPECT_EQ(bind_error(port, false), 0) << "the port stayed taken after the job";
}

}  // namespace
}  // namespace dscpp::launcher::testing
