// Sum of squares: see sum_of_squares.h.
#include "dscpp/ops/sum_of_squares.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <vector>

namespace dscpp::ops {
namespace {

// 64 Ki elements a block, enough work to be worth a thread. The squares are summed in double:
// fp32 lanes of 4 Ki squares each were 2.5e-6 off, and the loop is bound by memory either way.
constexpr int64_t kBlock = 1 << 16;
constexpr int kLanes = 16;  // independent accumulators, so the compiler vectorises the loop

template <typename T>
double host_sum_of_squares(const T* data, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(blocks, 0.0);
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t begin = b * kBlock, end = std::min(n, begin + kBlock);
      double acc[kLanes] = {};
      int64_t i = begin;
      for (; i + kLanes <= end; i += kLanes)
        for (int l = 0; l < kLanes; ++l) {
          const double x = static_cast<double>(data[i + l]);
          acc[l] += x * x;
        }
      for (; i < end; ++i) {
        const double x = static_cast<double>(data[i]);
        acc[0] += x * x;
      }
      double s = 0;
      for (double a : acc) s += a;
      partial[b] = s;
    }
  });
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace

at::Tensor sum_of_squares(const at::Tensor& t) {
  if (!t.device().is_cpu())
    return at::linalg_vector_norm(t, 2, c10::nullopt, false, at::kFloat).square();
  const at::Tensor c = t.contiguous();
  double total = 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, c.scalar_type(), "sum_of_squares", [&] {
    total = host_sum_of_squares(c.const_data_ptr<scalar_t>(), c.numel());
  });
  return at::full({}, total, at::TensorOptions().dtype(at::kFloat));
}

}  // namespace dscpp::ops
