// Prefetcher<T>: runs a producer on a background thread, `depth` items ahead of the consumer.
//
// The producer returns the next item, or nullopt at the end. next() blocks until an item is
// ready and returns them in production order; after the end it returns nullopt. An exception
// thrown by the producer stops production and is rethrown by the next() that reaches it (items
// produced before it are delivered first). Destruction stops the thread and joins it: a
// producer blocked on a full queue wakes at once; one inside its call is waited for.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>

#include "dscpp/error.h"

namespace dscpp::data {

template <typename T>
class Prefetcher {
 public:
  using Producer = std::function<std::optional<T>()>;

  Prefetcher(Producer produce, size_t depth) : produce_(std::move(produce)), depth_(depth) {
    if (depth_ < 1) throw dscpp::Error("Prefetcher: depth must be >= 1");
    thread_ = std::thread([this] { run(); });
  }

  ~Prefetcher() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    space_.notify_all();
    thread_.join();
  }

  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  std::optional<T> next() {
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [this] { return !queue_.empty() || done_; });
    if (!queue_.empty()) {
      T item = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      space_.notify_one();
      return item;
    }
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return std::nullopt;
  }

 private:
  void run() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        space_.wait(lock, [this] { return queue_.size() < depth_ || stop_; });
        if (stop_) break;
      }
      // Produced outside the lock, so the consumer takes ready items meanwhile.
      std::optional<T> item;
      std::exception_ptr error;
      try {
        item = produce_();
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (error || !item) {
        error_ = error;
        break;
      }
      queue_.push_back(std::move(*item));
      ready_.notify_one();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    ready_.notify_all();
  }

  Producer produce_;
  const size_t depth_;
  std::mutex mutex_;
  std::condition_variable ready_;  // an item or the end is there for the consumer
  std::condition_variable space_;  // the queue has room, or stop_
  std::deque<T> queue_;
  std::exception_ptr error_;  // rethrown once the queue before it is drained
  bool done_ = false;         // the producer thread will add nothing more
  bool stop_ = false;         // the destructor asks the thread to end
  std::thread thread_;        // last: it starts once everything above exists
};

}  // namespace dscpp::data
