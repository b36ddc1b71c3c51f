#include "dscpp/nn/normal_init.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dscpp/error.h"

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

// One stream of values: a contiguous CPU range and the seed its blocks' generators derive from.
struct Stream {
  at::Tensor flat;
  uint64_t seed;
};
using Fill = std::function<void(const at::Tensor& block, at::Generator& gen)>;

// Every stream's blocks of kBlock elements, block b of a stream from generator
// mix(seed ^ mix(b)), spread over as many threads of our own as LibTorch's intra-op threads
// (OMP_NUM_THREADS, which the launcher sets per rank): at::parallel_for runs serially in a
// translation unit not compiled with OpenMP (its INTRA_OP_PARALLEL needs _OPENMP), which ours
// are not. The values depend on the streams alone, not on the thread count.
void fill_streams(const std::vector<Stream>& streams, const Fill& fill) {
  std::vector<std::pair<size_t, int64_t>> blocks;  // (stream, block)
  for (size_t s = 0; s < streams.size(); ++s) {
    const int64_t n = streams[s].flat.numel();
    for (int64_t b = 0; b * kBlock < n; ++b) blocks.emplace_back(s, b);
  }
  const auto count = static_cast<int64_t>(blocks.size());
  if (count == 0) return;
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), count));
  std::vector<std::exception_ptr> errors(workers);
  auto work = [&](int64_t w) {
    at::NoGradGuard no_grad_here;  // grad mode is per thread: a parameter is a leaf
    try {
      for (int64_t i = w; i < count; i += workers) {
        const auto [s, b] = blocks[static_cast<size_t>(i)];
        const Stream& stream = streams[s];
        at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
            mix(stream.seed ^ mix(static_cast<uint64_t>(b))));
        const int64_t n = stream.flat.numel();
        fill(stream.flat.narrow(0, b * kBlock, std::min(kBlock, n - b * kBlock)), gen);
      }
    } catch (...) {
      errors[w] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (int64_t w = 1; w < workers; ++w) threads.emplace_back(work, w);
  work(0);
  for (auto& t : threads) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// Expert g's stream seed: apart from the plain blocks' (which mix the block index into the
// draw) by a salt, so expert 0's first block is not a plain tensor's first block.
uint64_t expert_seed(uint64_t draw, int64_t global_expert) {
  return mix(draw ^ mix(0x6578706572747321ULL + static_cast<uint64_t>(global_expert)));
}

void init_experts(const at::Tensor& stacked, int64_t first_expert, const std::string& what,
                  const Fill& fill) {
  at::NoGradGuard no_grad;
  if (stacked.dim() < 1 || first_expert < 0)
    throw dscpp::Error(what + ": expected an expert-major tensor [experts, ...] and a first " +
                       "global expert >= 0, got " + std::to_string(stacked.dim()) +
                       " dimensions and first expert " + std::to_string(first_expert));
  const uint64_t draw = draw_seed();  // one draw, whatever the number of local experts
  const bool direct =
      stacked.device().is_cpu() && stacked.is_contiguous() && stacked.scalar_type() == at::kFloat;
  // Drawn in fp32 on the host (as the CPU model is built), then cast and copied where needed.
  at::Tensor host = direct ? stacked : at::empty(stacked.sizes(), at::TensorOptions(at::kFloat));
  std::vector<Stream> streams;
  for (int64_t j = 0; j < host.size(0); ++j)
    streams.push_back({host[j].view({-1}), expert_seed(draw, first_expert + j)});
  fill_streams(streams, fill);
  if (!direct) stacked.copy_(host);
}

}  // namespace

void normal_init(const at::Tensor& tensor, double std) {
  at::NoGradGuard no_grad;
  if (!tensor.device().is_cpu() || !tensor.is_contiguous()) {
    tensor.normal_(0.0, std);
    return;
  }
  fill_streams(
      {{tensor.view({-1}), draw_seed()}},
      [std](const at::Tensor& block, at::Generator& gen) { block.normal_(0.0, std, gen); });
}

void normal_init_experts(const at::Tensor& stacked, double std, int64_t first_expert) {
  init_experts(
      stacked, first_expert, "normal_init_experts",
      [std](const at::Tensor& block, at::Generator& gen) { block.normal_(0.0, std, gen); });
}

void uniform_init_experts(const at::Tensor& stacked, double bound, int64_t first_expert) {
  init_experts(
      stacked, first_expert, "uniform_init_experts",
      [bound](const at::Tensor& block, at::Generator& gen) { block.uniform_(-bound, bound, gen); });
}

}  // namespace dscpp::nn
