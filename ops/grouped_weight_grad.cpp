// grouped_weight_grad_into: cuBLAS's grouped GEMM on a GPU, a loop of products elsewhere.
#include "dscpp/ops/grouped_weight_grad.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include "dscpp/error.h"

#ifdef DSCPP_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace dscpp::ops {

namespace {

void check_weight_grad_args(const at::Tensor& dw, const at::Tensor& rows, const at::Tensor& grad,
                            const std::vector<int64_t>& counts) {
  const bool shapes = dw.defined() && rows.defined() && grad.defined() && dw.dim() == 3 &&
                      rows.dim() == 2 && grad.dim() == 2 && rows.size(0) == grad.size(0) &&
                      dw.size(0) == static_cast<int64_t>(counts.size()) &&
                      dw.size(1) == rows.size(1) && dw.size(2) == grad.size(1);
  if (!shapes)
    throw Error(fmt::format(
        "grouped_weight_grad_into: expected dw [E, in, out], rows [N, in], grad [N, out] and "
        "E counts, got dw [{}], rows [{}], grad [{}], {} counts",
        dw.defined() ? fmt::format("{}", fmt::join(dw.sizes(), ", ")) : "",
        rows.defined() ? fmt::format("{}", fmt::join(rows.sizes(), ", ")) : "",
        grad.defined() ? fmt::format("{}", fmt::join(grad.sizes(), ", ")) : "", counts.size()));
  if (dw.scalar_type() != rows.scalar_type() || dw.scalar_type() != grad.scalar_type() ||
      dw.device() != rows.device() || dw.device() != grad.device() || !dw.is_contiguous())
    throw Error(fmt::format(
        "grouped_weight_grad_into: dw, rows and grad must share a dtype and a device and dw be "
        "contiguous, got {} on {}, {} on {}, {} on {}",
        c10::toString(dw.scalar_type()), dw.device().str(), c10::toString(rows.scalar_type()),
        rows.device().str(), c10::toString(grad.scalar_type()), grad.device().str()));
  int64_t sum = 0;
  bool negative = false;
  for (int64_t c : counts) {
    sum += c;
    negative = negative || c < 0;
  }
  if (negative || sum > rows.size(0))
    throw Error(fmt::format(
        "grouped_weight_grad_into: counts [{}] must be >= 0 and sum to at most the {} rows",
        fmt::join(counts, ", "), rows.size(0)));
}

void loop_into(const at::Tensor& dw, const at::Tensor& rows, const at::Tensor& grad,
               const std::vector<int64_t>& counts, bool accumulate) {
  int64_t o = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    at::Tensor block = dw[static_cast<int64_t>(e)];
    const int64_t c = counts[e];
    if (c == 0) {
      if (!accumulate) block.zero_();
      continue;
    }
    const at::Tensor a = rows.narrow(0, o, c).t(), b = grad.narrow(0, o, c);
    if (accumulate)
      block.addmm_(a, b);
    else
      at::mm_out(block, a, b);
    o += c;
  }
}

#ifdef DSCPP_CUDA
cudaDataType_t cuda_type(at::ScalarType t) {
  switch (t) {
    case at::kBFloat16:
      return CUDA_R_16BF;
    case at::kHalf:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// Column-major, as cuBLAS sees row-major storage: dw[e] [in, out] row-major is the
// column-major [out, in] matrix grad_e^T-by-rows_e, i.e. C = A · op(B) with A = grad_e
// (column-major [out, c], ld out, not transposed) and B = rows_e (column-major [in, c], ld in,
// transposed to [c, in]). One group per non-empty expert (each its own k = c).
void cublas_into(const at::Tensor& dw, const at::Tensor& rows, const at::Tensor& grad,
                 const std::vector<int64_t>& counts, bool accumulate) {
  const c10::cuda::CUDAGuard guard(dw.device());
  const int64_t in = rows.size(1), out = grad.size(1), elt = rows.element_size();
  const at::Tensor r = rows.contiguous(), g = grad.contiguous();
  const auto* rp = static_cast<const char*>(r.const_data_ptr());
  const auto* gp = static_cast<const char*>(g.const_data_ptr());
  auto* cp = static_cast<char*>(dw.data_ptr());
  std::vector<int> m, n, k, lda, ldb, ldc, size;
  std::vector<int64_t> a_ptrs, b_ptrs, c_ptrs;
  int64_t o = 0;
  for (size_t e = 0; e < counts.size(); ++e) {
    const int64_t c = counts[e];
    if (c == 0) {
      if (!accumulate) dw[static_cast<int64_t>(e)].zero_();
      continue;
    }
    m.push_back(static_cast<int>(out));
    n.push_back(static_cast<int>(in));
    k.push_back(static_cast<int>(c));
    lda.push_back(static_cast<int>(out));
    ldb.push_back(static_cast<int>(in));
    ldc.push_back(static_cast<int>(out));
    size.push_back(1);
    a_ptrs.push_back(reinterpret_cast<int64_t>(gp + o * out * elt));
    b_ptrs.push_back(reinterpret_cast<int64_t>(rp + o * in * elt));
    c_ptrs.push_back(reinterpret_cast<int64_t>(cp + static_cast<int64_t>(e) * in * out * elt));
    o += c;
  }
  const int groups = static_cast<int>(m.size());
  if (groups == 0) return;
  // A pointers, then B, then C, in one copy. Pinned, so that the copy is asynchronous; the
  // caching host allocator keeps the block until the copy on this stream has run.
  at::Tensor host = at::empty({3 * groups}, at::dtype(at::kLong).pinned_memory(true));
  int64_t* hp = host.data_ptr<int64_t>();
  std::copy(a_ptrs.begin(), a_ptrs.end(), hp);
  std::copy(b_ptrs.begin(), b_ptrs.end(), hp + groups);
  std::copy(c_ptrs.begin(), c_ptrs.end(), hp + 2 * groups);
  const at::Tensor dev = host.to(dw.device(), /*non_blocking=*/true);
  const auto* dp = reinterpret_cast<void* const*>(dev.const_data_ptr<int64_t>());
  const std::vector<cublasOperation_t> ta(groups, CUBLAS_OP_N), tb(groups, CUBLAS_OP_T);
  const std::vector<float> alpha(groups, 1.0f), beta(groups, accumulate ? 1.0f : 0.0f);
  const cudaDataType_t t = cuda_type(dw.scalar_type());
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();  // on the current stream
  const cublasStatus_t status =
      cublasGemmGroupedBatchedEx(handle, ta.data(), tb.data(), m.data(), n.data(), k.data(),
                                 alpha.data(), reinterpret_cast<const void* const*>(dp), t,
                                 lda.data(), reinterpret_cast<const void* const*>(dp + groups), t,
                                 ldb.data(), beta.data(), const_cast<void* const*>(dp + 2 * groups),
                                 t, ldc.data(), groups, size.data(), CUBLAS_COMPUTE_32F);
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(fmt::format(
        "grouped_weight_grad_into: cublasGemmGroupedBatchedEx failed: {} "
        "({} groups, in {}, out {}, {})",
        cublasGetStatusString(status), groups, in, out, c10::toString(dw.scalar_type())));
}
#endif

}  // namespace

bool grouped_weight_grad_uses_cublas(const at::Tensor& dw, const at::Tensor& rows,
                                     const at::Tensor& grad) {
#ifdef DSCPP_CUDA
  const auto t = dw.scalar_type();
  if (!dw.is_cuda() || (t != at::kBFloat16 && t != at::kHalf && t != at::kFloat)) return false;
  const int64_t per16 = 16 / static_cast<int64_t>(dw.element_size());
  auto aligned = [](const at::Tensor& x) {
    return reinterpret_cast<uintptr_t>(x.const_data_ptr()) % 16 == 0;
  };
  return rows.size(1) % per16 == 0 && grad.size(1) % per16 == 0 && aligned(dw) && aligned(rows) &&
         aligned(grad) && rows.size(1) <= std::numeric_limits<int>::max() &&
         grad.size(1) <= std::numeric_limits<int>::max();
#else
  (void)dw;
  (void)rows;
  (void)grad;
  return false;
#endif
}

bool per_expert_gemm_pays(const at::Tensor& dw, const std::vector<int64_t>& counts) {
  if (!dw.is_cuda()) return true;
  int64_t busy = 0;
  for (int64_t c : counts) busy += c > 0;
  if (4 * busy <= static_cast<int64_t>(counts.size())) return true;
#ifdef DSCPP_CUDA
  // cuBLAS's bf16 tiles on Hopper are about 128 x 256: one GEMM must give every SM one.
  const int64_t tiles = (dw.size(1) + 127) / 128 * ((dw.size(2) + 255) / 256);
  const int64_t sms = at::cuda::getDeviceProperties(dw.device().index())->multiProcessorCount;
  return 10 * tiles >= 9 * sms;
#else
  return false;
#endif
}

namespace {

// The four modes by name; the process's setting is an index into them (an atomic the size of a
// word: a struct of three fields would need libatomic).
constexpr std::array<std::pair<std::string_view, GroupedWeightGradMode>, 4> kModes = {{
    {"auto", {true, true, WeightGradKernel::kLoop}},
    {"loop", {true, false, WeightGradKernel::kLoop}},
    {"grouped", {true, false, WeightGradKernel::kGrouped}},
    {"off", {false, false, WeightGradKernel::kLoop}},
}};
std::atomic<int> g_mode{0};

bool same(const GroupedWeightGradMode& a, const GroupedWeightGradMode& b) {
  return a.into_destination == b.into_destination && a.automatic == b.automatic &&
         a.kernel == b.kernel;
}

}  // namespace

GroupedWeightGradMode parse_grouped_weight_grad_mode(const std::string& name) {
  for (const auto& [n, mode] : kModes)
    if (n == name) return mode;
  throw Error("grouped weight-gradient mode: expected auto, loop, grouped or off, found '" + name +
              "'");
}

GroupedWeightGradMode grouped_weight_grad_mode() {
  return kModes[static_cast<size_t>(g_mode.load(std::memory_order_relaxed))].second;
}

void set_grouped_weight_grad_mode(GroupedWeightGradMode mode) {
  for (size_t i = 0; i < kModes.size(); ++i)
    if (same(kModes[i].second, mode))
      return g_mode.store(static_cast<int>(i), std::memory_order_relaxed);
  throw Error("set_grouped_weight_grad_mode: not one of parse_grouped_weight_grad_mode's modes");
}

void grouped_weight_grad_into(const at::Tensor& dw, const at::Tensor& rows, const at::Tensor& grad,
                              const std::vector<int64_t>& counts, bool accumulate,
                              WeightGradKernel kernel) {
  check_weight_grad_args(dw, rows, grad, counts);
  // Named for the profilers (it is not an ATen op): the trace shows the products here.
  RECORD_FUNCTION("dscpp::grouped_weight_grad", std::vector<c10::IValue>({rows, grad}));
  at::NoGradGuard no_grad;
#ifdef DSCPP_CUDA
  if (kernel == WeightGradKernel::kGrouped && grouped_weight_grad_uses_cublas(dw, rows, grad)) {
    cublas_into(dw, rows, grad, counts, accumulate);
    return;
  }
#else
  (void)kernel;  // the loop is the only path without CUDA
#endif
  loop_into(dw, rows, grad, counts, accumulate);
}

}  // namespace dscpp::ops
