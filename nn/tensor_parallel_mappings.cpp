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

// Rank j's key/value groups of `kv_heads` over the p ranks: kv_heads / p, one more on the
// first kv_heads % p (DeepSpeed's split; equal blocks where p divides).
std::vector<int64_t> groups_per_rank(int64_t kv_heads, int64_t p) {
  std::vector<int64_t> counts(static_cast<size_t>(p), kv_heads / p);
  for (int64_t j = 0; j < kv_heads % p; ++j) ++counts[static_cast<size_t>(j)];
  return counts;
}

// A rank without a group would have no head to attend over, and a query head must stay with
// its key/value head (DeepSpeed refuses both).
void check_groups(int64_t heads, int64_t kv_heads, const comm::ProcessGroup& g) {
  if (kv_heads < g.size() || heads % kv_heads != 0)
    throw TensorParallelError(fmt::format(
        "sequence parallelism: {} attention heads in {} key/value groups do not split over the "
        "{} ranks of sequence-parallel group '{}': expected at least {} groups, each of the "
        "same number of heads",
        heads, kv_heads, g.size(), g.name(), g.size()));
}

void check_sequence(int64_t tokens, const comm::ProcessGroup& g) {
  if (tokens % g.size() != 0)
    throw TensorParallelError(fmt::format(
        "sequence parallelism: a sequence of {} tokens does not split over the {} ranks of "
        "sequence-parallel group '{}'",
        tokens, g.size(), g.name()));
}

// [B, n, s, d] (s = S/p) -> [B, n_r, p s, d]: head block j goes to rank j, which lays the
// ranks' slices of the sequence end to end.
at::Tensor sequence_to_heads(const at::Tensor& x, comm::ProcessGroup& g, int64_t kv_heads) {
  const int64_t p = g.size(), b = x.size(0), n = x.size(1), s = x.size(2), d = x.size(3);
  check_groups(n, kv_heads, g);
  if (kv_heads % p == 0) {  // equal blocks: one equal-split exchange
    const at::Tensor send = x.reshape({b, p, n / p, s, d}).transpose(0, 1).contiguous();
    at::Tensor got = at::empty_like(send);
    g.all_to_all(got, send).wait();  // got[i]: rank i's slice of this rank's heads
    return got.permute({1, 2, 0, 3, 4}).reshape({b, n / p, p * s, d});
  }
  // Uneven blocks: heads first, so that each rank's block is a run of rows.
  const int64_t per_group = n / kv_heads;
  std::vector<int64_t> send_heads = groups_per_rank(kv_heads, p);
  for (auto& c : send_heads) c *= per_group;
  const int64_t m = send_heads[static_cast<size_t>(g.rank())];
  const at::Tensor send = x.transpose(0, 1).contiguous();  // [n, B, s, d]
  at::Tensor got = at::empty({p * m, b, s, d}, send.options());
  g.all_to_all(got, send, std::vector<int64_t>(static_cast<size_t>(p), m), send_heads).wait();
  // got: rank i's slice of this rank's m heads, for i in rank order.
  return got.view({p, m, b, s, d}).permute({2, 1, 0, 3, 4}).reshape({b, m, p * s, d});
}

// [B, n_r, p s, d] -> [B, n, s, d]: sequence slice i goes to rank i, which lays the ranks'
// head blocks side by side.
at::Tensor heads_to_sequence(const at::Tensor& x, comm::ProcessGroup& g, int64_t kv_heads) {
  const int64_t p = g.size(), b = x.size(0), m = x.size(1), d = x.size(3);
  check_sequence(x.size(2), g);
  const int64_t s = x.size(2) / p;
  const std::vector<int64_t> groups = groups_per_rank(kv_heads, p);
  const int64_t mine = groups[static_cast<size_t>(g.rank())];
  if (kv_heads < p || m % mine != 0)
    throw TensorParallelError(fmt::format(
        "sequence parallelism: {} heads on rank {} of sequence-parallel group '{}' are not its "
        "{} of {} key/value groups",
        m, g.rank(), g.name(), mine, kv_heads));
  if (kv_heads % p == 0) {
    const at::Tensor send = x.reshape({b, m, p, s, d}).permute({2, 0, 1, 3, 4}).contiguous();
    at::Tensor got = at::empty_like(send);
    g.all_to_all(got, send).wait();  // got[j]: rank j's heads of this rank's slice
    return got.transpose(0, 1).reshape({b, p * m, s, d});
  }
  const int64_t per_group = m / mine;
  std::vector<int64_t> got_heads = groups;
  for (auto& c : got_heads) c *= per_group;
  // [p, m, B, s, d]: rows [i m, (i + 1) m) are slice i of each head, for rank i.
  const at::Tensor send = x.reshape({b, m, p, s, d}).permute({2, 1, 0, 3, 4}).contiguous();
  at::Tensor got = at::empty({kv_heads * per_group, b, s, d}, send.options());
  g.all_to_all(got, send.view({p * m, b, s, d}), got_heads,
               std::vector<int64_t>(static_cast<size_t>(p), m))
      .wait();  // got: rank j's heads of this rank's slice, for j in rank order
  return got.transpose(0, 1).contiguous();
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

// The Ulysses exchanges: one in forward, its converse on the output's gradient, both over the
// same key/value groups.
template <bool ToHeads>
struct UlyssesAllToAll : torch::autograd::Function<UlyssesAllToAll<ToHeads>> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            detail::GroupHolderPtr holder, int64_t kv_heads) {
    comm::ProcessGroup& g = *holder->group;
    detail::save_group(ctx, std::move(holder));
    ctx->saved_data["kv_heads"] = kv_heads;
    return ToHeads ? sequence_to_heads(x, g, kv_heads) : heads_to_sequence(x, g, kv_heads);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    comm::ProcessGroup& g = *detail::saved_group(ctx);
    const int64_t kv_heads = ctx->saved_data["kv_heads"].toInt();
    return {ToHeads ? heads_to_sequence(grads[0], g, kv_heads)
                    : sequence_to_heads(grads[0], g, kv_heads),
            at::Tensor(), at::Tensor()};
  }
};

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

at::Tensor all_to_all_sequence_to_heads(const at::Tensor& x, const GroupPtr& group,
                                        int64_t kv_heads) {
  if (tensor_model_parallel_size(group) == 1) return x;
  return UlyssesAllToAll<true>::apply(x, detail::hold_group(group), kv_heads);
}
at::Tensor all_to_all_heads_to_sequence(const at::Tensor& x, const GroupPtr& group,
                                        int64_t kv_heads) {
  if (tensor_model_parallel_size(group) == 1) return x;
  return UlyssesAllToAll<false>::apply(x, detail::hold_group(group), kv_heads);
}

}  // namespace dscpp::nn
