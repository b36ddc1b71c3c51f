// Internal (comm's .cpp files only): which rank of a group did not arrive. Every collective
// a group issues gets the next sequence number; a heartbeat thread writes
// "<seq> <unix ms> <op>" under dscpp_hb/<rank> in the group's store at a fraction of the
// timeout. When a collective fails (Gloo past its timeout, a dead peer) the waiting rank
// reads the others' entries and names the ranks that never reached its sequence number or
// whose heartbeat stopped (a SIGSTOPped or wedged process): c10d's own errors name only the
// waiting rank, and the NCCL build has no Gloo monitored barrier.
// On NCCL, where wait() does not block the host, the thread also watches the collectives in
// flight and prints the diagnosis once one is past the timeout, before NCCL's watchdog
// takes the process down.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dscpp::comm {

class ArrivalMonitor {
 public:
  ArrivalMonitor(c10::intrusive_ptr<c10d::Store> store, std::string group, int rank,
                 std::vector<int> global_ranks, std::chrono::milliseconds timeout,
                 bool watch_in_flight);
  ~ArrivalMonitor();
  ArrivalMonitor(const ArrivalMonitor&) = delete;
  ArrivalMonitor& operator=(const ArrivalMonitor&) = delete;

  // Records that this rank reached its next collective; returns that collective's number.
  uint64_t arrive(const char* op);
  // With watch_in_flight: the thread reports `work` if it is still running after the timeout.
  void track(c10::intrusive_ptr<c10d::Work> work, uint64_t seq, std::string op);
  // "rank 2 (global 2) did not arrive: ..." for the ranks behind collective `seq`, or a
  // sentence saying why nobody could be named. Bounded: it never waits on the store longer
  // than a few seconds (rank 0, which serves the store, may be the silent one).
  std::string diagnose(uint64_t seq) const;

  std::chrono::milliseconds interval() const { return interval_; }

 public:
  struct State;

 private:
  // Everything the heartbeat thread touches: shared with it, so that the destructor can let
  // the thread go (detach) instead of joining one stuck on a store that stopped answering.
  std::shared_ptr<State> s_;
  std::chrono::milliseconds interval_;
};

}  // namespace dscpp::comm
