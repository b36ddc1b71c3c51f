// The tensor-parallel mappings: the collectives along a dimension, then each pair of them as
// one autograd function.
#include "dscpp/ops/autograd_function.h"  // first: see there

#include "dscpp/nn/tensor_parallel_mappings.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <vector>

#include "dscpp/nn/autograd_group.h"

namespace dscpp::nn {

int tensor_model_parallel_size(const GroupPtr& group) {
  return group ? group->size() : 1;
}

int tensor_model_parallel_rank(const GroupPtr& group) {
  return group ? group->rank() : 0;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void check_divides(const at::Tensor& x, int64_t dim, const comm::ProcessGroup& g) {
  if (x.dim() == 0 || x.size(dim) % g.size() != 0)
    throw TensorParallelError(fmt::format(
        "tensor parallelism: dimension {} of a tensor of shape [{}] does not split into {} "
        "equal parts (the size of model-parallel group '{}')",
        dim, fmt::join(x.sizes(), ", "), g.size(), g.name()));
}

at::Tensor identity(const at::Tensor& x, comm::ProcessGroup&) {
  return x;
}

at::Tensor all_reduce(const at::Tensor& x, comm::ProcessGroup& g) {
  at::Tensor out = x.contiguous().clone();
  g.all_reduce(out).wait();
  return out;
}

// Rank r's chunk along `dim`, contiguous (the collectives and kernels after want it so).
at::Tensor split(const at::Tensor& x, int64_t dim, comm::ProcessGroup& g) {
  check_divides(x, dim, g);
  return x.chunk(g.size(), dim)[g.rank()].contiguous();
}
at::Tensor split_first(const at::Tensor& x, comm::ProcessGroup& g) {
  return split(x, 0, g);
}
at::Tensor split_last(const at::Tensor& x, comm::ProcessGroup& g) {
  return split(x, -1, g);
}

// The ranks' tensors concatenated along dim 0: all_gather writes them there directly.
at::Tensor gather_first(const at::Tensor& x, comm::ProcessGroup& g) {
  auto sizes = x.sizes().vec();
  sizes[0] *= g.size();
  at::Tensor out = at::empty(sizes, x.options().memory_format(at::MemoryFormat::Contiguous));
  g.all_gather(out, x.contiguous()).wait();
  return out;
}

// Along the last dim: gathered flat (Gloo wants the output in chunks of the input's shape),
// then viewed [size, ...] and laid side by side.
at::Tensor gather_last(const at::Tensor& x, comm::ProcessGroup& g) {
  auto sizes = x.sizes().vec();
  sizes.insert(sizes.begin(), g.size());
  at::Tensor out = at::empty({x.numel() * g.size()}, x.options());
  g.all_gather(out, x.contiguous().view(-1)).wait();
  return at::cat(out.view(sizes).unbind(0), -1);
}

at::Tensor reduce_scatter_first(const at::Tensor& x, comm::ProcessGroup& g) {
  check_divides(x, 0, g);
  auto sizes = x.sizes().vec();
  sizes[0] /= g.size();
  at::Tensor out = at::empty(sizes, x.options().memory_format(at::MemoryFormat::Contiguous));
  g.reduce_scatter(out, x.contiguous()).wait();
  return out;
}

using Collective = at::Tensor (*)(const at::Tensor&, comm::ProcessGroup&);

// One mapping: Forward in forward, Backward on the output's gradient.
template <Collective Forward, Collective Backward>
struct Mapping : torch::autograd::Function<Mapping<Forward, Backward>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            detail::GroupHolderPtr holder) {
    comm::ProcessGroup& g = *holder->group;
    detail::save_group(ctx, std::move(holder));
    return Forward(x, g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {Backward(grads[0], *detail::saved_group(ctx)), at::Tensor()};
  }
};

using CopyToRegion = Mapping<identity, all_reduce>;
using ReduceFromRegion = Mapping<all_reduce, identity>;
using ScatterToRegion = Mapping<split_last, gather_last>;
using GatherFromRegion = Mapping<gather_last, split_last>;
using ScatterToSequence = Mapping<split_first, gather_first>;
using GatherFromSequence = Mapping<gather_first, reduce_scatter_first>;
using GatherFromSequenceWholeGrad = Mapping<gather_first, split_first>;
using ReduceScatterToSequence = Mapping<reduce_scatter_first, gather_first>;

template <typename F>
at::Tensor apply(const at::Tensor& x, const GroupPtr& group) {
  if (tensor_model_parallel_size(group) == 1) return x;
  return F::apply(x, detail::hold_group(group));
}

}  // namespace

at::Tensor copy_to_tensor_model_parallel_region(const at::Tensor& x, const GroupPtr& group) {
  return apply<CopyToRegion>(x, group);
}
at::Tensor reduce_from_tensor_model_parallel_region(const at::Tensor& x, const GroupPtr& group) {
  return apply<ReduceFromRegion>(x, group);
}
at::Tensor scatter_to_tensor_model_parallel_region(const at::Tensor& x, const GroupPtr& group) {
  return apply<ScatterToRegion>(x, group);
}
at::Tensor gather_from_tensor_model_parallel_region(const at::Tensor& x, const GroupPtr& group) {
  return apply<GatherFromRegion>(x, group);
}
at::Tensor scatter_to_sequence_parallel_region(const at::Tensor& x, const GroupPtr& group) {
  return apply<ScatterToSequence>(x, group);
}
at::Tensor gather_from_sequence_parallel_region(const at::Tensor& x, const GroupPtr& group,
                                                bool tensor_parallel_output_grad) {
  return tensor_parallel_output_grad ? apply<GatherFromSequence>(x, group)
                                     : apply<GatherFromSequenceWholeGrad>(x, group);
}
at::Tensor reduce_scatter_to_sequence_parallel_region(const at::Tensor& x, const GroupPtr& group) {
  return apply<ReduceScatterToSequence>(x, group);
}

}  // namespace dscpp::nn
