// Expert-parallel dispatch and combine: the counts exchange, the rows' all-to-all as an
// autograd function, and the regrouping between source-major and local-expert-major order.
#include "dscpp/ops/autograd_function.h"  // first: see there

#include "dscpp/nn/moe/expert_parallel_dispatch.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>

#include "dscpp/nn/autograd_group.h"

namespace dscpp::nn::moe {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t sum_of(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

at::Tensor exchange(const at::Tensor& x, const std::vector<int64_t>& out_splits,
                    const std::vector<int64_t>& in_splits, comm::ProcessGroup& group) {
  auto sizes = x.sizes().vec();
  sizes[0] = sum_of(out_splits);
  at::Tensor out = at::empty(sizes, x.options().memory_format(at::MemoryFormat::Contiguous));
  group.all_to_all(out, x.contiguous(), out_splits, in_splits).wait();
  return out;
}

class AllToAllRows : public torch::autograd::Function<AllToAllRows> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const std::vector<int64_t>& out_splits,
                            const std::vector<int64_t>& in_splits, const GroupPtr& group) {
    nn::detail::save_group(ctx, nn::detail::hold_group(group));
    ctx->saved_data["out_splits"] = out_splits;
    ctx->saved_data["in_splits"] = in_splits;
    return exchange(x, out_splits, in_splits, *group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto& group = nn::detail::saved_group(ctx);
    // The gradient goes back the way the rows came: the splits swap roles.
    at::Tensor dx = exchange(grads[0], ctx->saved_data["in_splits"].toIntVector(),
                             ctx->saved_data["out_splits"].toIntVector(), *group);
    return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Chunks of x (dim 0) of the given sizes, laid [a][b] in x, concatenated in [b][a] order.
at::Tensor transpose_chunks(const at::Tensor& x, const std::vector<int64_t>& sizes, int64_t a,
                            int64_t b) {
  if (a == 1 || b == 1) return x;
  auto chunks = x.split_with_sizes(sizes, 0);
  std::vector<at::Tensor> reordered;
  reordered.reserve(chunks.size());
  for (int64_t j = 0; j < b; ++j)
    for (int64_t i = 0; i < a; ++i) reordered.push_back(chunks[i * b + j]);
  return at::cat(reordered, 0);
}

std::vector<int64_t> transposed(const std::vector<int64_t>& v, int64_t a, int64_t b) {
  std::vector<int64_t> t(v.size());
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j) t[j * a + i] = v[i * b + j];
  return t;
}

}  // namespace

at::Tensor all_to_all_rows(const at::Tensor& x, const std::vector<int64_t>& output_splits,
                           const std::vector<int64_t>& input_splits, const GroupPtr& group) {
  if (!group || group->size() == 1) return x;
  return AllToAllRows::apply(x, output_splits, input_splits, group);
}

ExpertParallelDispatch expert_parallel_dispatch(const at::Tensor& rows, const at::Tensor& counts,
                                                const GroupPtr& ep_group) {
  const int64_t ep = ep_group ? ep_group->size() : 1;
  if (!rows.defined() || rows.dim() != 2 || !counts.defined() || counts.dim() != 1 ||
      counts.scalar_type() != at::kLong || counts.numel() == 0 || counts.numel() % ep != 0)
    throw ExpertParallelError(fmt::format(
        "expert-parallel dispatch: expected rows [R, H] and int64 counts [num_experts] with "
        "num_experts a multiple of ep_size {}, got rows [{}] and counts [{}]",
        ep, rows.defined() ? fmt::format("{}", fmt::join(rows.sizes(), ", ")) : "undefined",
        counts.defined() ? fmt::format("{}", fmt::join(counts.sizes(), ", ")) : "undefined"));
  const int64_t local = counts.numel() / ep;
  at::Tensor host = counts.to(at::kCPU).contiguous();
  std::vector<int64_t> mine(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
  bool negative = false;
  for (int64_t c : mine) negative = negative || c < 0;
  const int64_t routed = sum_of(mine);
  if (negative || routed > rows.size(0))
    throw ExpertParallelError(fmt::format(
        "expert-parallel dispatch: counts [{}] must be >= 0 and sum to at most the {} rows",
        fmt::join(mine, ", "), rows.size(0)));
  // Rows past the counts are the permutation's padding (its GPU path): not sent.
  const at::Tensor sent_rows = rows.narrow(0, 0, routed);

  ExpertParallelDispatch d;
  d.num_local_experts = local;
  if (ep == 1) {
    d.rows = sent_rows;
    d.local_counts = host;
    d.by_source = mine;
    d.send_splits = d.recv_splits = {routed};
    return d;
  }
  // The counts first: chunk j of [ep, E_l] goes to rank j, so row i of what arrives is what
  // rank i sends to each of this rank's experts.
  at::Tensor sent = counts.to(rows.device()).contiguous(), got = at::empty_like(sent);
  ep_group->all_to_all(got, sent).wait();
  at::Tensor got_host = got.to(at::kCPU).contiguous();
  d.by_source.assign(got_host.data_ptr<int64_t>(), got_host.data_ptr<int64_t>() + got.numel());
  d.local_counts = got_host.view({ep, local}).sum(0);
  for (int64_t r = 0; r < ep; ++r) {
    int64_t s = 0, g = 0;
    for (int64_t e = 0; e < local; ++e) {
      s += mine[r * local + e];
      g += d.by_source[r * local + e];
    }
    d.send_splits.push_back(s);
    d.recv_splits.push_back(g);
  }
  at::Tensor arrived = all_to_all_rows(sent_rows, d.recv_splits, d.send_splits, ep_group);
  d.rows = transpose_chunks(arrived, d.by_source, ep, local);  // source-major -> expert-major
  return d;
}

at::Tensor expert_parallel_combine(const at::Tensor& expert_rows, const ExpertParallelDispatch& d,
                                   const GroupPtr& ep_group) {
  const int64_t ep = ep_group ? ep_group->size() : 1;
  if (!expert_rows.defined() || expert_rows.dim() != 2 || expert_rows.size(0) != d.rows.size(0) ||
      static_cast<int64_t>(d.send_splits.size()) != ep)
    throw ExpertParallelError(fmt::format(
        "expert-parallel combine: expected the experts' rows [{}, H'] of a dispatch over {} "
        "ranks, got [{}] over {}",
        d.rows.defined() ? d.rows.size(0) : 0, d.send_splits.size(),
        expert_rows.defined() ? fmt::format("{}", fmt::join(expert_rows.sizes(), ", ")) : "", ep));
  if (ep == 1) return expert_rows;
  const int64_t local = d.num_local_experts;
  at::Tensor source_major =
      transpose_chunks(expert_rows, transposed(d.by_source, ep, local), local, ep);
  return all_to_all_rows(source_major, d.send_splits, d.recv_splits, ep_group);
}

AllToAllTokenDispatcher::AllToAllTokenDispatcher(GroupPtr ep_group)
    : ep_group_(std::move(ep_group)) {
  if (!ep_group_) throw ExpertParallelError("AllToAllTokenDispatcher: no expert-parallel group");
}

ExpertInput AllToAllTokenDispatcher::dispatch(const at::Tensor& tokens, const Routing& routing) {
  permuted_ = permute_tokens(tokens, routing);
  dispatched_ =
      expert_parallel_dispatch(permuted_.permutation.rows, permuted_.permutation.counts, ep_group_);
  return {dispatched_.rows, dispatched_.local_counts};
}

at::Tensor AllToAllTokenDispatcher::combine(const at::Tensor& expert_rows) {
  at::Tensor rows = expert_parallel_combine(expert_rows, dispatched_, ep_group_);
  at::Tensor out = unpermute_tokens(rows, permuted_);
  permuted_ = {};
  dispatched_ = {};
  return out;
}

}  // namespace dscpp::nn::moe
