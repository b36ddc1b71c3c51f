// ArrivalMonitor: heartbeat entries in the group's store, and reading them back.
#include "dscpp/comm/arrival_monitor.h"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

#include "dscpp/comm/error_text.h"

namespace dscpp::comm {

namespace {

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string key_of(int rank) {
  return fmt::format("dscpp_hb/{}", rank);
}

}  // namespace

std::string diagnose(const std::shared_ptr<ArrivalMonitor::State>& s, uint64_t seq);

struct ArrivalMonitor::State {
  c10::intrusive_ptr<c10d::Store> store;
  std::string group;
  int rank = 0;
  std::vector<int> global_ranks;
  std::chrono::milliseconds timeout{0};
  std::chrono::milliseconds interval{0};
  bool watch_in_flight = false;

  struct InFlight {
    // Weak: the monitor must not keep a collective's tensors alive (ZeRO frees a bucket
    // by dropping it); a work nobody holds any more is finished as far as we can tell.
    c10::weak_intrusive_ptr<c10d::Work> work;
    uint64_t seq;
    std::string op;
    std::chrono::steady_clock::time_point start;
  };
  std::mutex mu;
  std::condition_variable cv;
  uint64_t seq = 0;
  std::string op = "init";
  bool stop = false;
  bool dirty = false;  // an arrival not yet written
  std::deque<InFlight> in_flight;

  static bool finished(const InFlight& f) {
    c10::intrusive_ptr<c10d::Work> w = f.work.lock();
    return !w || w->isCompleted();
  }
  // Under mu.
  void prune() {
    while (!in_flight.empty() && finished(in_flight.front())) in_flight.pop_front();
  }

  void push() {
    std::string value;
    {
      std::lock_guard<std::mutex> lock(mu);
      value = fmt::format("{} {} {}", seq, unix_ms(), op);
    }
    store->set(key_of(rank), std::vector<uint8_t>(value.begin(), value.end()));
  }

  void check_in_flight(const std::shared_ptr<State>& self) {
    std::vector<InFlight> late;
    {
      std::lock_guard<std::mutex> lock(mu);
      prune();
      auto now = std::chrono::steady_clock::now();
      while (!in_flight.empty() && now - in_flight.front().start > timeout) {
        late.push_back(in_flight.front());
        in_flight.pop_front();
      }
    }
    for (const InFlight& f : late) {
      double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - f.start).count();
      // std::cerr, not fmt::print: this is the watchdog's thread, and fmt::print throws when
      // stderr is a pipe whose reader has gone, which here would be std::terminate.
      std::cerr << fmt::format(
                       "dscpp: {} #{} on group '{}' (rank {}) still running after {:.1f} s: {}\n",
                       f.op, f.seq, group, rank, waited, comm::diagnose(self, f.seq))
                << std::flush;
    }
  }
};

ArrivalMonitor::ArrivalMonitor(c10::intrusive_ptr<c10d::Store> store, std::string group, int rank,
                               std::vector<int> global_ranks, std::chrono::milliseconds timeout,
                               bool watch_in_flight)
    : s_(std::make_shared<State>()) {
  // Several beats per timeout, so that a silent rank is told from a slow one long before
  // anyone gives up; never so often that the store becomes the bottleneck.
  interval_ =
      std::clamp(timeout / 8, std::chrono::milliseconds(50), std::chrono::milliseconds(2000));
  s_->store = std::move(store);
  s_->group = std::move(group);
  s_->rank = rank;
  s_->global_ranks = std::move(global_ranks);
  s_->timeout = timeout;
  s_->interval = interval_;
  s_->watch_in_flight = watch_in_flight;
  s_->push();  // every rank has an entry from the start: "never reported" means never joined
  std::shared_ptr<State> s = s_;
  std::thread([s] {
    std::unique_lock<std::mutex> lock(s->mu);
    while (!s->stop) {
      // A new arrival is written at once (so the entry says which collective a rank stopped
      // before), a quiet rank still beats once an interval, and a burst of small collectives
      // costs at most eight writes an interval.
      s->cv.wait_for(lock, s->interval, [&] { return s->stop || s->dirty; });
      if (s->stop) break;
      s->dirty = false;
      lock.unlock();
      try {
        s->push();
        if (s->watch_in_flight) s->check_in_flight(s);
      } catch (const std::exception&) {
        // The store is gone (rank 0 exited): the collectives report the failure themselves.
      }
      lock.lock();
      s->cv.wait_for(lock, s->interval / 8, [&] { return s->stop; });
    }
  }).detach();
}

ArrivalMonitor::~ArrivalMonitor() {
  {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->stop = true;
  }
  s_->cv.notify_all();
}

uint64_t ArrivalMonitor::arrive(const char* op) {
  std::lock_guard<std::mutex> lock(s_->mu);
  s_->op = op;
  s_->dirty = true;
  s_->cv.notify_one();
  return ++s_->seq;
}

void ArrivalMonitor::track(c10::intrusive_ptr<c10d::Work> work, uint64_t seq, std::string op) {
  std::lock_guard<std::mutex> lock(s_->mu);
  if (!s_->watch_in_flight) return;
  s_->prune();
  s_->in_flight.push_back({c10::weak_intrusive_ptr<c10d::Work>(work), seq, std::move(op),
                           std::chrono::steady_clock::now()});
}

std::string ArrivalMonitor::diagnose(uint64_t seq) const {
  return comm::diagnose(s_, seq);
}

std::string diagnose(const std::shared_ptr<ArrivalMonitor::State>& s_, uint64_t seq) {
  using State = ArrivalMonitor::State;
  // The reads run on their own thread, which is abandoned if the store does not answer:
  // when rank 0 is the silent one, its store is silent too.
  struct Result {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    std::string text;
  };
  auto result = std::make_shared<Result>();
  std::shared_ptr<State> s = s_;
  std::thread([s, seq, result] {
    std::string text;
    try {
      int64_t now = unix_ms();
      double stale_s = 3 * std::chrono::duration<double>(s->interval).count() + 2;
      std::vector<std::string> missing, parts;
      for (int r = 0; r < static_cast<int>(s->global_ranks.size()); ++r) {
        if (r == s->rank) continue;
        std::string who = fmt::format("rank {} (global {})", r, s->global_ranks[r]);
        if (!s->store->check({key_of(r)})) {
          missing.push_back(std::to_string(r));
          parts.push_back(who + " never joined the group");
          continue;
        }
        std::vector<uint8_t> raw = s->store->get(key_of(r));
        std::istringstream in(std::string(raw.begin(), raw.end()));
        uint64_t their_seq = 0;
        int64_t their_ms = 0;
        std::string their_op;
        in >> their_seq >> their_ms >> their_op;
        double age = static_cast<double>(now - their_ms) / 1000.0;
        if (their_seq < seq) {
          missing.push_back(std::to_string(r));
          parts.push_back(
              fmt::format("{} did not arrive: its last reported collective is #{} ({}), {}", who,
                          their_seq, their_op,
                          age > stale_s ? fmt::format("no heartbeat for {:.1f} s", age)
                                        : std::string("alive")));
        } else if (age > stale_s) {
          missing.push_back(std::to_string(r));
          parts.push_back(fmt::format(
              "{} reached #{} ({}) but has sent no heartbeat for {:.1f} s (stopped or wedged)", who,
              their_seq, their_op, age));
        }
      }
      if (missing.empty()) {
        text = fmt::format("every rank of the group reached collective #{} and is alive", seq);
      } else {
        std::string ranks;
        for (const auto& m : missing) ranks += (ranks.empty() ? "" : ", ") + m;
        std::string detail;
        for (const auto& p : parts) detail += (detail.empty() ? "" : "; ") + p;
        text = fmt::format("silent rank(s) {} of group '{}' at collective #{}: {}", ranks, s->group,
                           seq, detail);
      }
    } catch (const std::exception& e) {
      text = fmt::format("could not read the other ranks' heartbeats: {}", error_text(e));
    }
    std::lock_guard<std::mutex> lock(result->mu);
    result->text = std::move(text);
    result->done = true;
    result->cv.notify_all();
  }).detach();
  auto deadline = std::chrono::seconds(5);
  std::unique_lock<std::mutex> lock(result->mu);
  if (!result->cv.wait_for(lock, deadline, [&] { return result->done; }))
    return fmt::format(
        "the store (served by global rank 0) did not answer within {} s: rank 0 is the "
        "likely silent one",
        deadline.count());
  return result->text;
}

}  // namespace dscpp::comm
