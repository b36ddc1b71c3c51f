// ArrivalMonitor against a HashStore shared by three in-process "ranks": the diagnosis names
// exactly the rank that stayed behind, then the one whose heartbeat stopped, and nobody
// when all arrived.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <chrono>
#include <memory>
#include <thread>

#include "dscpp/comm/arrival_monitor.h"

using dscpp::comm::ArrivalMonitor;

namespace {

std::unique_ptr<ArrivalMonitor> make(const c10::intrusive_ptr<c10d::Store>& store, int rank) {
  // 400 ms timeout: a heartbeat every 50 ms.
  return std::make_unique<ArrivalMonitor>(store, "g", rank, std::vector<int>{10, 11, 12},
                                          std::chrono::milliseconds(400), false);
}

}  // namespace

TEST(ArrivalMonitor, NamesTheRankBehindThenTheSilentOne) {
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
  auto r0 = make(store, 0), r1 = make(store, 1), r2 = make(store, 2);
  EXPECT_EQ(r0->interval(), std::chrono::milliseconds(50));
  uint64_t seq = 0;
  for (int i = 0; i < 5; ++i) {
    seq = r0->arrive("all_reduce");
    r1->arrive("all_reduce");
    if (i < 4) r2->arrive("broadcast");
  }
  EXPECT_EQ(seq, 5u);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a few heartbeats
  std::string d = r0->diagnose(seq);
  EXPECT_NE(d.find("silent rank(s) 2 of group 'g' at collective #5: rank 2 (global 12) did not "
                   "arrive: its last reported collective is #4 (broadcast), alive"),
            std::string::npos)
      << d;
  EXPECT_EQ(d.find("rank 1"), std::string::npos) << d;

  r2->arrive("broadcast");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  d = r1->diagnose(seq);
  EXPECT_NE(d.find("every rank of the group reached collective #5 and is alive"), std::string::npos)
      << d;

  // Rank 2 reached #5 and then went quiet (its heartbeat thread is gone): still named.
  r2.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(2600));  // past 3 beats + 2 s
  d = r0->diagnose(seq);
  EXPECT_NE(d.find("silent rank(s) 2 of group 'g' at collective #5: rank 2 (global 12) reached "
                   "#5 (broadcast) but has sent no heartbeat for"),
            std::string::npos)
      << d;
}

TEST(ArrivalMonitor, ARankThatNeverJoinedIsNamed) {
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
  auto r0 = make(store, 0), r1 = make(store, 1);
  uint64_t seq = r0->arrive("barrier");
  r1->arrive("barrier");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 1's beat carries #1
  std::string d = r0->diagnose(seq);
  EXPECT_NE(d.find("silent rank(s) 2 of group 'g' at collective #1: rank 2 (global 12) never "
                   "joined the group"),
            std::string::npos)
      << d;
}
