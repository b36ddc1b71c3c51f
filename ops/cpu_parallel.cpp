// The split over LibTorch's intra-op threads (cpu_parallel.h).
#include "dscpp/ops/cpu_parallel.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>

// libgomp's ABI, what GCC lowers `#pragma omp parallel` to (GOMP_4.0, stable since GCC 4.9;
// LLVM's libomp exports the same names for compatibility). Weak: a process without an OpenMP
// runtime links and runs, and parallel_ranges falls back on ATen's pool.
extern "C" {
void GOMP_parallel(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags)
    __attribute__((weak));
int omp_get_thread_num() __attribute__((weak));
int omp_get_num_threads() __attribute__((weak));
void omp_set_num_threads(int n) __attribute__((weak));
}

namespace dscpp::ops::cpu {
namespace {

bool have_openmp() {
  return GOMP_parallel != nullptr && omp_get_thread_num != nullptr &&
         omp_get_num_threads != nullptr;
}

// One call's ranges and what its threads share: range k is [k * chunk, min(n, (k + 1) * chunk)).
struct Job {
  int64_t n = 0, chunk = 0, ranges = 0;
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::exception_ptr error;

  void run_range(int64_t k) {
    const int64_t begin = k * chunk, end = std::min(n, begin + chunk);
    if (begin >= end || failed.load(std::memory_order_relaxed)) return;
    try {
      (*fn)(begin, end);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!error) error = std::current_exception();
      failed = true;
    }
  }
};

// Each thread of the team: thread t takes ranges t, t + team, ... (one range each when the team
// is as large as asked for; a smaller team, e.g. nested in another region, still covers all).
void region(void* data) {
  Job& job = *static_cast<Job*>(data);
  const int64_t team = std::max(1, omp_get_num_threads());
  for (int64_t k = omp_get_thread_num(); k < job.ranges; k += team) job.run_range(k);
}

}  // namespace

void parallel_ranges(int64_t n, int64_t align, int64_t grain,
                     const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  align = std::max<int64_t>(1, align);
  grain = std::max<int64_t>(1, grain);
  const int64_t workers = std::clamp<int64_t>(n / grain, 1, std::max(1, at::get_num_threads()));
  if (workers == 1) {
    fn(0, n);
    return;
  }
  Job job;
  job.n = n;
  job.chunk = ((n + workers - 1) / workers + align - 1) / align * align;
  job.ranges = (n + job.chunk - 1) / job.chunk;
  job.fn = &fn;
  if (have_openmp()) {
    GOMP_parallel(&region, &job, static_cast<unsigned>(job.ranges), 0);
  } else {
    at::parallel_for(0, job.ranges, 1, [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) job.run_range(k);
    });
  }
  if (job.error) std::rethrow_exception(job.error);
}

void limit_thread_team(int n) {
  if (!have_openmp() || omp_set_num_threads == nullptr) return;
  // First LibTorch's own per-thread initialisation (at::get_num_threads() runs it once per
  // thread, setting the thread's team to the process-wide count): after it, it never runs again
  // on this thread to undo the limit.
  const int now = at::get_num_threads();
  omp_set_num_threads(std::clamp(n, 1, std::max(1, now)));
}

const char* parallel_backend() {
  return have_openmp() ? "openmp" : "aten";
}

}  // namespace dscpp::ops::cpu
