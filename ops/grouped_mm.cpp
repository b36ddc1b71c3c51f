// grouped_mm: ATen's _grouped_mm where its stride rule holds, a loop of products elsewhere,
// both behind one autograd Function.
#include "dscpp/ops/autograd_function.h"  // first: see there

#include "dscpp/ops/grouped_mm.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/ops/deferred_grads.h"
#include "dscpp/ops/grad_destination.h"
#include "dscpp/ops/grouped_weight_grad.h"

#ifdef DSCPP_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dscpp::ops {

namespace {

void check_grouped_mm_args(const at::Tensor& rows, const at::Tensor& weights,
                           const at::Tensor& counts) {
  if (!rows.defined() || !weights.defined() || !counts.defined() || rows.dim() != 2 ||
      weights.dim() != 3 || counts.dim() != 1 || rows.size(1) != weights.size(1) ||
      counts.size(0) != weights.size(0) || counts.scalar_type() != at::kLong)
    throw dscpp::Error(fmt::format(
        "grouped_mm: expected rows [N, in], weights [E, in, out] and int64 counts [E], got "
        "rows [{}], weights [{}], counts [{}] of {}",
        fmt::join(rows.sizes(), ", "), fmt::join(weights.sizes(), ", "),
        fmt::join(counts.sizes(), ", "),
        counts.defined() ? c10::toString(counts.scalar_type()) : "none"));
  if (rows.scalar_type() != weights.scalar_type() || rows.device() != weights.device())
    throw dscpp::Error(
        fmt::format("grouped_mm: rows ({}, {}) and weights ({}, {}) must share a "
                    "dtype and a device",
                    c10::toString(rows.scalar_type()), rows.device().str(),
                    c10::toString(weights.scalar_type()), weights.device().str()));
}

std::vector<int64_t> host_counts(const at::Tensor& counts, int64_t n) {
  at::Tensor c = counts.to(at::kCPU).contiguous();
  std::vector<int64_t> v(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
  int64_t sum = 0;
  bool negative = false;
  for (int64_t x : v) {
    sum += x;
    negative = negative || x < 0;
  }
  if (negative || sum > n)
    throw dscpp::Error(
        fmt::format("grouped_mm: counts [{}] must be >= 0 and sum to at most the {} rows",
                    fmt::join(v, ", "), n));
  return v;
}

bool aligned(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// out[rows of e] = a[rows of e] @ b[e]: b [E, k, n].
at::Tensor loop_forward(const at::Tensor& a, const at::Tensor& b, const std::vector<int64_t>& c) {
  at::Tensor out = at::empty({a.size(0), b.size(2)}, a.options());
  int64_t o = 0;
  for (size_t e = 0; e < c.size(); ++e) {
    if (c[e] > 0) {
      at::Tensor block = out.narrow(0, o, c[e]);
      at::mm_out(block, a.narrow(0, o, c[e]), b[e]);
    }
    o += c[e];
  }
  if (o < a.size(0)) out.narrow(0, o, a.size(0) - o).zero_();  // padding rows
  return out;
}

// dw[e] = a[rows of e]^T @ g[rows of e]: the loop of grouped_weight_grad_into, into a new tensor.
at::Tensor loop_weight_grad(const at::Tensor& a, const at::Tensor& g,
                            const std::vector<int64_t>& c) {
  at::Tensor dw = at::empty({static_cast<int64_t>(c.size()), a.size(1), g.size(1)}, a.options());
  grouped_weight_grad_into(dw, a, g, c, /*accumulate=*/false, WeightGradKernel::kLoop);
  return dw;
}

// The counts on their way to the host, for backward's grouped GEMM into the gradient
// destination (which takes its shapes from the host): copied in forward, behind the routing
// that made them, so that by backward the copy has long landed and waiting for it costs
// nothing. Held by the autograd context as an opaque capsule.
struct HostCounts : torch::CustomClassHolder {
  at::Tensor host;  // int64 [E], pinned
#ifdef DSCPP_CUDA
  at::cuda::CUDAEvent landed;
#endif
  std::vector<int64_t> wait() {
#ifdef DSCPP_CUDA
    landed.synchronize();
#endif
    return std::vector<int64_t>(host.const_data_ptr<int64_t>(),
                                host.const_data_ptr<int64_t>() + host.numel());
  }
};

c10::intrusive_ptr<HostCounts> start_host_counts(const at::Tensor& counts) {
  auto hc = c10::make_intrusive<HostCounts>();
  hc->host = at::empty({counts.numel()}, at::dtype(at::kLong).pinned_memory(true));
  hc->host.copy_(counts, /*non_blocking=*/true);
#ifdef DSCPP_CUDA
  hc->landed.record(c10::cuda::getCurrentCUDAStream(counts.device().index()));
#endif
  return hc;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class GroupedMm : public torch::autograd::Function<GroupedMm> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, const at::Tensor& weights,
                            const at::Tensor& counts,
                            const std::optional<at::Tensor>& given_offsets) {
    const at::Tensor r = rows.contiguous(), w = weights.contiguous();
    const bool aten = grouped_mm_uses_aten(r, w);
    ctx->saved_data["aten"] = aten;
    // On the host the counts are checked (free there); on a device that would be a wait.
    std::vector<int64_t> c;
    if (r.is_cpu() || !aten) c = host_counts(counts, r.size(0));
    const at::Tensor offs =
        !aten ? at::Tensor()
              : (given_offsets ? *given_offsets : grouped_mm_offsets(counts, r.device()));
    ctx->save_for_backward({r, w, counts, offs});
    // The weight gradient goes straight into its destination when it has one; on a GPU that
    // needs the counts on the host by then.
    if (aten && !r.is_cpu() && w.requires_grad() && grouped_weight_grad_mode().into_destination &&
        has_grad_destination(w))
      ctx->saved_data["host_counts"] = c10::IValue::make_capsule(start_host_counts(counts));
    if (aten) return at::_grouped_mm(r, w, offs);
    return loop_forward(r, w, c);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &rows = saved[0], &weights = saved[1], &counts = saved[2];
    const at::Tensor g = grads[0].contiguous();
    at::Tensor d_rows, d_weights;
    const bool aten = ctx->saved_data["aten"].toBool() && aligned(g);
    // Where the counts are on the host (the CPU, or copied there in forward), the weight
    // gradient may be written into its destination (gradient accumulation fusion).
    std::optional<std::vector<int64_t>> c;
    auto hc = ctx->saved_data.find("host_counts");
    if (hc != ctx->saved_data.end())
      c = c10::static_intrusive_pointer_cast<HostCounts>(hc->second.toCapsule())->wait();
    else if (rows.is_cpu() || !aten)
      c = host_counts(counts, rows.size(0));
    const at::Tensor& offs = saved[3];
    if (ctx->needs_input_grad(0))
      d_rows = aten ? at::_grouped_mm(g, weights.transpose(1, 2), offs)
                    : loop_forward(g, weights.transpose(1, 2), *c);
    if (ctx->needs_input_grad(1)) {
      // Into the weights' destination where they have one; put off to W inside a split
      // backward (deferred_grads.h).
      auto product = [weights, rows, g, c, offs, aten] {
        const bool written =
            c && grouped_weight_grad_mode().into_destination &&
            (!grouped_weight_grad_mode().automatic || per_expert_gemm_pays(weights, *c)) &&
            write_grad_into(weights, weights.sizes(), rows, [&](at::Tensor slot, bool accumulate) {
              grouped_weight_grad_into(slot, rows, g, *c, accumulate);
            });
        if (written) return at::Tensor();
        return aten ? at::_grouped_mm(rows.t(), g, offs) : loop_weight_grad(rows, g, *c);
      };
      if (!defer_weight_grad(weights, product)) d_weights = product();
    }
    return {d_rows, d_weights, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool grouped_mm_uses_aten(const at::Tensor& rows, const at::Tensor& weights) {
  const auto dt = rows.scalar_type();
  if (dt != weights.scalar_type() || (dt != at::kFloat && dt != at::kBFloat16 && dt != at::kHalf))
    return false;
  const int64_t per16 = 16 / static_cast<int64_t>(rows.element_size());
  return rows.size(1) % per16 == 0 && weights.size(2) % per16 == 0 && rows.is_contiguous() &&
         weights.is_contiguous() && aligned(rows) && aligned(weights);
}

at::Tensor grouped_mm_offsets(const at::Tensor& counts, const at::Device& device) {
  return counts.to(device).cumsum(0).to(at::kInt);
}

at::Tensor grouped_mm(const at::Tensor& rows, const at::Tensor& weights, const at::Tensor& counts,
                      const at::Tensor& offsets) {
  check_grouped_mm_args(rows, weights, counts);
  if (offsets.defined() && (offsets.scalar_type() != at::kInt || offsets.dim() != 1 ||
                            offsets.size(0) != counts.size(0) || offsets.device() != rows.device()))
    throw dscpp::Error(fmt::format(
        "grouped_mm: offsets must be int32 [{}] on {} (grouped_mm_offsets), got {} [{}] on {}",
        counts.size(0), rows.device().str(), c10::toString(offsets.scalar_type()),
        fmt::join(offsets.sizes(), ", "), offsets.device().str()));
  // An optional, not an undefined tensor: autograd's Function takes every tensor argument
  // for an input with a device.
  return GroupedMm::apply(rows, weights, counts,
                          offsets.defined() ? std::optional<at::Tensor>(offsets) : std::nullopt);
}

at::Tensor grouped_mm_loop(const at::Tensor& rows, const at::Tensor& weights,
                           const at::Tensor& counts) {
  check_grouped_mm_args(rows, weights, counts);
  return loop_forward(rows.contiguous(), weights.contiguous(), host_counts(counts, rows.size(0)));
}

}  // namespace dscpp::ops
