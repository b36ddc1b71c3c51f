// Expert-parallel dispatch and combine: the counts exchange, the rows' all-to-all in flight,
// and the regrouping between source-major and local-expert-major order, in both layouts.
#include "dscpp/nn/moe/expert_parallel_dispatch.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <utility>

#include "dscpp/nn/moe/all_to_all_in_flight.h"

namespace dscpp::nn::moe {

namespace {

int64_t sum_of(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

std::string sizes_of(const at::Tensor& t) {
  return t.defined() ? fmt::format("{}", fmt::join(t.sizes(), ", ")) : "undefined";
}

// x's exchange with `beside` run while it is on the wire.
at::Tensor exchange_beside(const at::Tensor& x, const GroupPtr& group,
                           const std::vector<int64_t>& out_splits,
                           const std::vector<int64_t>& in_splits, const Beside& beside) {
  AllToAllInFlight flight = AllToAllInFlight::start(x, group, out_splits, in_splits);
  if (beside) beside();
  return flight.wait();
}

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

ExpertParallelDispatch expert_parallel_dispatch(const at::Tensor& rows, const at::Tensor& counts,
                                                const GroupPtr& ep_group, const Beside& beside) {
  const int64_t ep = ep_group ? ep_group->size() : 1;
  if (!rows.defined() || rows.dim() != 2 || !counts.defined() || counts.dim() != 1 ||
      counts.scalar_type() != at::kLong || counts.numel() == 0 || counts.numel() % ep != 0)
    throw ExpertParallelError(fmt::format(
        "expert-parallel dispatch: expected rows [R, H] and int64 counts [num_experts] with "
        "num_experts a multiple of ep_size {}, got rows [{}] and counts [{}]",
        ep, sizes_of(rows), sizes_of(counts)));
  const int64_t local = counts.numel() / ep;
  note_host_count_read();
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
    if (beside) beside();
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
  at::Tensor arrived = exchange_beside(sent_rows, ep_group, d.recv_splits, d.send_splits, beside);
  d.rows = transpose_chunks(arrived, d.by_source, ep, local);  // source-major -> expert-major
  return d;
}

ExpertParallelDispatch expert_parallel_dispatch_padded(const at::Tensor& rows, int64_t num_experts,
                                                       int64_t capacity, const GroupPtr& ep_group,
                                                       const Beside& beside) {
  const int64_t ep = ep_group ? ep_group->size() : 1;
  if (!rows.defined() || rows.dim() != 2 || capacity < 0 || num_experts < 1 ||
      num_experts % ep != 0 || rows.size(0) != num_experts * capacity)
    throw ExpertParallelError(fmt::format(
        "expert-parallel dispatch: expected the padded rows [num_experts * capacity, H] = "
        "[{} * {}, H] with num_experts a multiple of ep_size {}, got rows [{}]",
        num_experts, capacity, ep, sizes_of(rows)));
  ExpertParallelDispatch d;
  d.num_local_experts = num_experts / ep;
  d.capacity = capacity;
  const int64_t h = rows.size(1);
  // Chunk j, the [E_l, C] slots of rank j's experts, goes to rank j; chunk i of what arrives
  // is rank i's rows for this rank's experts: [ep, E_l, C] -> each expert's ep * C rows.
  at::Tensor arrived = exchange_beside(rows, ep_group, {}, {}, beside);
  d.rows = arrived.view({ep, d.num_local_experts, capacity, h})
               .transpose(0, 1)
               .reshape({d.num_local_experts, ep * capacity, h});
  return d;
}

at::Tensor expert_parallel_combine(const at::Tensor& expert_rows, const ExpertParallelDispatch& d,
                                   const GroupPtr& ep_group, const Beside& beside) {
  const int64_t ep = ep_group ? ep_group->size() : 1;
  const int64_t local = d.num_local_experts;
  if (d.capacity >= 0) {
    if (!expert_rows.defined() || expert_rows.dim() != 3 || expert_rows.size(0) != local ||
        expert_rows.size(1) != ep * d.capacity)
      throw ExpertParallelError(fmt::format(
          "expert-parallel combine: expected the experts' padded rows [{}, {}, H'] of a "
          "dispatch over {} ranks, got [{}]",
          local, ep * d.capacity, ep, sizes_of(expert_rows)));
    const int64_t h = expert_rows.size(2);
    at::Tensor source_major = expert_rows.view({local, ep, d.capacity, h})
                                  .transpose(0, 1)
                                  .reshape({ep * local * d.capacity, h});
    return exchange_beside(source_major, ep_group, {}, {}, beside);
  }
  if (!expert_rows.defined() || expert_rows.dim() != 2 || expert_rows.size(0) != d.rows.size(0) ||
      static_cast<int64_t>(d.send_splits.size()) != ep)
    throw ExpertParallelError(fmt::format(
        "expert-parallel combine: expected the experts' rows [{}, H'] of a dispatch over {} "
        "ranks, got [{}] over {}",
        d.rows.defined() ? d.rows.size(0) : 0, d.send_splits.size(),
        expert_rows.defined() ? sizes_of(expert_rows) : "", ep));
  if (ep == 1) {
    if (beside) beside();
    return expert_rows;
  }
  at::Tensor source_major =
      transpose_chunks(expert_rows, transposed(d.by_source, ep, local), local, ep);
  return exchange_beside(source_major, ep_group, d.send_splits, d.recv_splits, beside);
}

AllToAllTokenDispatcher::AllToAllTokenDispatcher(GroupPtr ep_group, bool padded_capacity)
    : ep_group_(std::move(ep_group)), padded_capacity_(padded_capacity) {
  if (!ep_group_) throw ExpertParallelError("AllToAllTokenDispatcher: no expert-parallel group");
}

ExpertInput AllToAllTokenDispatcher::dispatch(const at::Tensor& tokens, const Routing& routing,
                                              const Beside& beside) {
  if (routing.capacity >= 0 && padded_capacity_) {
    permuted_ = permute_tokens_padded(tokens, routing);
    dispatched_ = expert_parallel_dispatch_padded(permuted_.permutation.rows, routing.num_experts,
                                                  routing.capacity, ep_group_, beside);
    return {dispatched_.rows, at::Tensor()};
  }
  permuted_ = permute_tokens(tokens, routing);
  dispatched_ = expert_parallel_dispatch(permuted_.permutation.rows, permuted_.permutation.counts,
                                         ep_group_, beside);
  return {dispatched_.rows, dispatched_.local_counts};
}

at::Tensor AllToAllTokenDispatcher::combine(const at::Tensor& expert_rows, const Beside& beside) {
  at::Tensor rows = expert_parallel_combine(expert_rows, dispatched_, ep_group_, beside);
  at::Tensor out = unpermute_tokens(rows, permuted_);
  permuted_ = {};
  dispatched_ = {};
  return out;
}

}  // namespace dscpp::nn::moe
