#include "model_zoo/normal_init.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <mutex>

namespace dscpp::model_zoo {

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
  at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(mix(seed ^ mix(b)));
      flat.narrow(0, b * kBlock, std::min(kBlock, n - b * kBlock)).normal_(0.0, std, gen);
    }
  });
}

}  // namespace dscpp::model_zoo
