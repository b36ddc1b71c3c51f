#include "dscpp/nn/normal_init.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace dscpp::nn {

namespace {

constexpr int64_t kBlock = int64_t{1} << 20;

// splitmix64's finaliser: neighbouring block indices give unrelated generator seeds.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t draw_seed() {
  auto gen = at::detail::getDefaultCPUGenerator();
  auto* impl = at::check_generator<at::CPUGeneratorImpl>(gen);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return impl->random64();
}

}  // namespace

void normal_init(const at::Tensor& tensor, double std) {
  at::NoGradGuard no_grad;
  if (!tensor.device().is_cpu() || !tensor.is_contiguous()) {
    tensor.normal_(0.0, std);
    return;
  }
  const uint64_t seed = draw_seed();
  const at::Tensor flat = tensor.view({-1});
  const int64_t n = flat.numel(), blocks = (n + kBlock - 1) / kBlock;
  // Threads of our own: at::parallel_for runs serially in a translation unit not compiled
  // with OpenMP (its INTRA_OP_PARALLEL needs _OPENMP), which ours are not. As many as
  // LibTorch's intra-op threads (OMP_NUM_THREADS, which the launcher sets per rank).
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), blocks));
  std::vector<std::exception_ptr> errors(workers);
  auto fill = [&](int64_t w) {
    at::NoGradGuard no_grad_here;  // grad mode is per thread: a parameter is a leaf
    try {
      for (int64_t b = w; b < blocks; b += workers) {
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(mix(seed ^ mix(b)));
        flat.narrow(0, b * kBlock, std::min(kBlock, n - b * kBlock)).normal_(0.0, std, gen);
      }
    } catch (...) {
      errors[w] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (int64_t w = 1; w < workers; ++w) threads.emplace_back(fill, w);
  fill(0);
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace dscpp::nn
