// Work on the CPU split over LibTorch's own intra-op threads, from units built without OpenMP.
// at::parallel_for cannot do it there: it is an inline template whose `#pragma omp parallel`
// compiles to a serial loop without -fopenmp, and clang's -fopenmp would bring LLVM's libomp
// beside the GNU libgomp that LibTorch's wheel ships (two thread pools). So this calls the entry
// point GCC compiles `#pragma omp parallel` to (libgomp's GOMP_parallel, found at run time in
// the libgomp LibTorch loaded): the same team of threads ATen's kernels and DeepSpeed's OpenMP
// kernels run on, which spin a while between regions (a region starts in microseconds) and
// keep their range from call to call (thread k always takes the k-th range, so a partition that
// fits the caches stays in the same core's). Where no libgomp is loaded (a LibTorch built with
// its native thread pool), ATen's at::parallel_for does the split, which works there.
#pragma once

#include <cstdint>
#include <functional>

namespace dscpp::ops::cpu {

// fn(begin, end) over [0, n) cut into contiguous ranges of whole `align`-element blocks (the last
// range takes the rest), one range per thread: at most LibTorch's intra-op thread count
// (at::get_num_threads()), and no range shorter than `grain` elements (fewer threads below it;
// below 2 * grain the caller's thread alone). The calling thread takes the first range; blocks
// until every range is done and rethrows the first exception a range threw. Called from inside
// such a region it runs serially on the calling thread.
void parallel_ranges(int64_t n, int64_t align, int64_t grain,
                     const std::function<void(int64_t, int64_t)>& fn);

// At most n threads (at least 1) for the calling thread's parallel work from now on:
// parallel_ranges and ATen's CPU ops called from it, whose team size is the thread's own OpenMP
// setting (each thread that starts a parallel region leads a team of its own). For a worker thread
// that runs CPU work beside the thread queuing a GPU's kernels, so that together they never ask for
// more cores than the process has: 16 update threads and the launching thread on 16 cores make the
// launches wait for a time slice. Only the calling thread is affected (LibTorch's process-wide
// count, at::set_num_threads, is not). Without libgomp (ATen's native pool), nothing changes.
void limit_thread_team(int n);

// "openmp" (LibTorch's libgomp team) or "aten" (at::parallel_for): what parallel_ranges uses here.
const char* parallel_backend();

}  // namespace dscpp::ops::cpu
