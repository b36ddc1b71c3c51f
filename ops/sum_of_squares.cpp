// Sum of squares: see sum_of_squares.h.
#include "dscpp/ops/sum_of_squares.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>

#include <cstdint>
#include <type_traits>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/ops/cpu_adam_kernels.h"
#include "dscpp/ops/cpu_parallel.h"

namespace dscpp::ops {
namespace {

// 64 Ki elements a block, enough work to be worth a thread. The squares are summed in double:
// fp32 lanes of 4 Ki squares each were 2.5e-6 off.
constexpr int64_t kBlock = 1 << 16;
constexpr int kLanes = 16;  // independent accumulators, so the compiler vectorises the loop
// Blocks a thread takes at least (256 Ki elements): below that a thread costs more than it saves.
constexpr int64_t kGrainBlocks = 4;

// One block: fp32 and 16-bit elements through the CPU kernels' table (cpu_adam_kernels.h: the
// same loop compiled for this CPU's instruction set), double here.
double block_sum(const double* data, int64_t begin, int64_t end) {
  double acc[kLanes] = {};
  int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += data[i + l] * data[i + l];
  for (; i < end; ++i) acc[0] += data[i] * data[i];
  double s = 0;
  for (double a : acc) s += a;
  return s;
}

template <typename T>
double block_sum(const T* data, int64_t begin, int64_t end) {
  using cpu::kernels::Type;
  const Type type = std::is_same_v<T, c10::BFloat16> ? Type::kBFloat16
                    : std::is_same_v<T, c10::Half>   ? Type::kHalf
                                                     : Type::kFloat;
  return cpu::kernels::best_table().sum_of_squares(data, type, begin, end);
}

// Every block's partial sum, the blocks split over LibTorch's intra-op threads (ops/
// cpu_parallel.h: this unit has no OpenMP, where at::parallel_for would run serially), then the
// partials added in block order: the same result whatever the thread count.
template <typename T>
double sum_blocks(const T* data, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(blocks, 0.0);
  cpu::parallel_ranges(blocks, 1, kGrainBlocks, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      partial[b] = block_sum(data, b * kBlock, std::min(n, (b + 1) * kBlock));
  });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace

double host_sum_of_squares(const at::Tensor& t) {
  if (!t.device().is_cpu())
    throw Error("host_sum_of_squares: the tensor is on " + t.device().str() + ", not the CPU");
  const at::Tensor c = t.contiguous();
  double total = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, c.scalar_type(), "sum_of_squares", [&] {
    total = sum_blocks(c.const_data_ptr<scalar_t>(), c.numel());
  });
  return total;
}

at::Tensor sum_of_squares(const at::Tensor& t) {
  if (!t.device().is_cpu())
    return at::linalg_vector_norm(t, 2, c10::nullopt, false, at::kFloat).square();
  return at::full({}, host_sum_of_squares(t), at::TensorOptions().dtype(at::kFloat));
}

}  // namespace dscpp::ops
