// zero/host_landing.h on the CPU: chunks land in their slices of a host partition off the
// calling thread (copied straight, or added with and without a scale, across types), in queue
// order, each reported once it is there; land() waits while kMaxInFlight chunks are pending; a
// failed chunk's error reaches drain(); the phases are reported by name and start again at zero.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "dscpp/zero/host_landing.h"

namespace {

using dscpp::zero::HostLanding;

TEST(HostLanding, ChunksLandStraightOrAddedInQueueOrderOffTheCallingThread) {
  at::manual_seed(3);
  at::Tensor partition = at::randn({30});
  const at::Tensor before = partition.clone();
  const at::Tensor a = at::randn({10}), b = at::randn({10}).to(at::kBFloat16), c = at::randn({10});
  std::mutex mutex;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  HostLanding landing(at::kCPU);
  landing.set_on_landed([&](int bucket) {
    std::lock_guard<std::mutex> lock(mutex);
    order.push_back(bucket);
    threads.push_back(std::this_thread::get_id());
  });
  landing.land(0, a, partition.slice(0, 0, 10), /*straight=*/true, 1.0);
  landing.land(1, b, partition.slice(0, 10, 20), /*straight=*/false, 1.0);  // bf16 into fp32
  landing.land(2, c, partition.slice(0, 20, 30), /*straight=*/false, 0.25);
  landing.drain();
  EXPECT_TRUE(at::equal(partition.slice(0, 0, 10), a));
  EXPECT_TRUE(at::equal(partition.slice(0, 10, 20), before.slice(0, 10, 20) + b.to(at::kFloat)));
  EXPECT_TRUE(at::allclose(partition.slice(0, 20, 30), before.slice(0, 20, 30) + c * 0.25));
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
  for (const auto& id : threads) EXPECT_NE(id, std::this_thread::get_id());
  EXPECT_EQ(landing.device_bytes(), 0);  // (nothing comes from a device here)
}

TEST(HostLanding, LandWaitsWhileTwoChunksArePending) {
  at::Tensor partition = at::zeros({3});
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  HostLanding landing(at::kCPU);
  // The first chunk's report holds the worker: it stays pending, and so does the second.
  landing.set_on_landed([&](int bucket) {
    if (bucket == 0) released.wait();
  });
  landing.land(0, at::ones({1}), partition.slice(0, 0, 1), true, 1.0);
  landing.land(1, at::ones({1}), partition.slice(0, 1, 2), true, 1.0);
  static_assert(HostLanding::kMaxInFlight == 2);
  std::atomic<bool> third_returned{false};
  std::thread t([&] {
    landing.land(2, at::ones({1}), partition.slice(0, 2, 3), true, 1.0);
    third_returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(third_returned.load());
  release.set_value();
  t.join();
  EXPECT_TRUE(third_returned.load());
  landing.drain();
  EXPECT_TRUE(at::equal(partition, at::ones({3})));
  dscpp::zero::PhaseTimes times;
  landing.take_times(times);
  double queue_wait = -1;
  for (const auto& [name, ms] : times)
    if (name == "landing.queue_wait") queue_wait = ms;
  EXPECT_GT(queue_wait, 50.0);  // the third land() waited about 100 ms
  times.clear();
  landing.take_times(times);
  for (const auto& [name, ms] : times) EXPECT_EQ(ms, 0.0) << name;
}

TEST(HostLanding, ALandedChunksSumOfSquaresIsWrittenBeforeItIsReported) {
  at::manual_seed(4);
  at::Tensor partition = at::randn({40});
  const at::Tensor a = at::randn({20});
  double sum = -1, seen_at_report = -2;
  HostLanding landing(at::kCPU);
  landing.set_on_landed([&](int) { seen_at_report = sum; });
  landing.land(0, a, partition.slice(0, 0, 20), /*straight=*/false, 2.0, &sum);
  landing.drain();
  const double want = partition.slice(0, 0, 20).to(at::kDouble).square().sum().item<double>();
  EXPECT_NEAR(sum, want, 1e-12 * want);  // of the chunk after the add
  EXPECT_EQ(seen_at_report, sum);
}

TEST(HostLanding, AFailedChunkReachesDrainAndTheNextChunksStillLand) {
  at::Tensor partition = at::zeros({8});
  HostLanding landing(at::kCPU);
  // An add of 5 elements into 4 cannot broadcast: the worker's error, rethrown once.
  landing.land(0, at::ones({5}), partition.slice(0, 0, 4), /*straight=*/false, 1.0);
  EXPECT_THROW(landing.drain(), std::exception);
  landing.land(1, at::ones({4}), partition.slice(0, 4, 8), /*straight=*/false, 1.0);
  landing.drain();
  EXPECT_TRUE(at::equal(partition.slice(0, 4, 8), at::ones({4})));
}

}  // namespace
