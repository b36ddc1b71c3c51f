// tp_comm_overlap: the pieces of a pipelined collective and the row-parallel product whose
// reduction is pipelined with it.
#include "dscpp/ops/autograd_function.h"  // first: see there

#include "dscpp/nn/tp_comm_overlap.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dscpp/nn/autograd_group.h"
#include "dscpp/nn/linear.h"

namespace dscpp::nn {

std::vector<std::pair<int64_t, int64_t>> tp_comm_overlap_pieces(int64_t rows, int64_t num_splits) {
  if (num_splits < 1)
    throw TensorParallelError(
        fmt::format("tp_comm_overlap: num_splits must be at least 1, found {}", num_splits));
  const int64_t n = std::max<int64_t>(1, std::min(num_splits, rows));
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t offset = 0;
  for (int64_t j = 0; j < n; ++j) {
    // at::tensor_split's rule: the first rows % n pieces one row longer.
    const int64_t length = rows / n + (j < rows % n ? 1 : 0);
    out.emplace_back(offset, length);
    offset += length;
  }
  return out;
}

namespace {

using detail::GroupHolderPtr;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// As nn::linear's forward without a bias: the same product of each row.
at::Tensor product_without_bias(const at::Tensor& x, const at::Tensor& weight) {
  RECORD_FUNCTION("dscpp::linear", std::vector<c10::IValue>({x, weight, at::Tensor()}));
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  return at::mm(x.reshape({-1, x.size(-1)}), weight.t()).view(sizes);
}

at::Tensor forward_pipelined(const at::Tensor& x_in, const at::Tensor& weight,
                             comm::ProcessGroup& g, bool sequence_parallel, int64_t num_splits) {
  const at::Tensor x = x_in.contiguous();
  const int64_t t = g.size();
  if (sequence_parallel && (x.dim() == 0 || x.size(0) % t != 0))
    throw TensorParallelError(fmt::format(
        "RowParallelLinear: dimension 0 of its input [{}] does not split into {} sequence "
        "shards (the size of model-parallel group '{}')",
        fmt::join(x.sizes(), ", "), t, g.name()));
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = weight.size(0);
  // Sequence parallel: rank r's output rows are rows r·s/t .. of the sum; the pieces cut each
  // rank's share alike, so the input is viewed [t, s/t, ...] and piece j is [:, off_j:+len_j].
  const int64_t rows = sequence_parallel ? x.size(0) / t : x.size(0);
  if (sequence_parallel) out_sizes[0] = rows;
  at::Tensor out = at::empty(out_sizes, x.options().memory_format(at::MemoryFormat::Contiguous));
  at::Tensor x_ranks;
  if (sequence_parallel) {
    auto v = x.sizes().vec();
    v[0] = rows;
    v.insert(v.begin(), t);
    x_ranks = x.view(v);
  }
  std::vector<comm::Work> works;
  std::vector<at::Tensor> partials;  // each reduce-scatter's input, alive until it has run
  for (const auto& [offset, length] : tp_comm_overlap_pieces(rows, num_splits)) {
    at::Tensor slice = out.narrow(0, offset, length);  // contiguous: a dim-0 slice
    if (sequence_parallel) {
      auto v = x.sizes().vec();
      v[0] = t * length;
      // [t, len, ..., out]: the t chunks the reduce-scatter sums, rank r's chunk first-dim r.
      partials.push_back(
          product_without_bias(x_ranks.narrow(1, offset, length).reshape(v), weight));
      works.push_back(g.reduce_scatter(slice, partials.back()));
    } else {
      // The product straight into its rows of the output, all-reduced there in place.
      const at::Tensor piece = x.narrow(0, offset, length);
      RECORD_FUNCTION("dscpp::linear", std::vector<c10::IValue>({piece, weight, at::Tensor()}));
      at::Tensor slice2 = slice.view({-1, slice.size(-1)});
      at::mm_out(slice2, piece.reshape({-1, piece.size(-1)}), weight.t());
      works.push_back(g.all_reduce(slice));
    }
  }
  for (auto& w : works) w.wait();
  return out;
}

struct RowParallelOverlapped : torch::autograd::Function<RowParallelOverlapped> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            GroupHolderPtr holder, bool sequence_parallel, int64_t num_splits) {
    comm::ProcessGroup& g = *holder->group;
    detail::save_group(ctx, std::move(holder));
    ctx->saved_data["sequence_parallel"] = sequence_parallel;
    ctx->save_for_backward({x, weight});
    return forward_pipelined(x, weight, g, sequence_parallel, num_splits);
  }

  // The synchronous path's backward: the reduction's conjugate, then nn::linear's products.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(5);
    if (!grads[0].defined()) return out;
    auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    at::Tensor grad = grads[0].contiguous();
    if (ctx->saved_data["sequence_parallel"].toBool()) {
      comm::ProcessGroup& g = *detail::saved_group(ctx);
      auto sizes = grad.sizes().vec();
      sizes[0] *= g.size();
      at::Tensor whole = at::empty(sizes, grad.options());
      g.all_gather(whole, grad).wait();
      grad = whole;
    }
    const at::Tensor g2 = grad.reshape({-1, grad.size(-1)});
    if (ctx->needs_input_grad(0)) out[0] = at::mm(g2, weight).view(x.sizes());
    if (ctx->needs_input_grad(1)) out[1] = at::mm(g2.t(), x.reshape({-1, x.size(-1)}));
    return out;
  }
};

}  // namespace

at::Tensor row_parallel_linear_overlapped(const at::Tensor& x, const at::Tensor& weight,
                                          const GroupPtr& group, bool sequence_parallel,
                                          int64_t num_splits) {
  tp_comm_overlap_pieces(1, num_splits);  // the check of num_splits, whatever the group
  if (tensor_model_parallel_size(group) == 1) return nn::linear(x, weight, at::Tensor());
  return RowParallelOverlapped::apply(x, weight, detail::hold_group(group), sequence_parallel,
                                      num_splits);
}

}  // namespace dscpp::nn
