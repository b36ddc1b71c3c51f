// Tensor-parallel merge and split: see tp_reshape.h.
#include "dscpp/runtime/checkpoint/tp_reshape.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <numeric>

namespace dscpp::checkpoint {

namespace {

// The widths along partition_dim of the pieces rank r holds, in order, and where each starts in
// the logical tensor: one piece per sub-part.
struct Piece {
  int64_t begin, width;
};
std::vector<Piece> pieces_of(const ParamPartition& p, int64_t rank, const std::string& name) {
  const int64_t dim = *p.partition_dim, full = p.logical_shape.at(dim), t = p.tp_degree;
  std::vector<Piece> out;
  if (!p.sub_param_sizes.empty()) {
    int64_t begin = 0;
    for (int64_t part : p.sub_param_sizes) {
      if (part % t != 0)
        throw CheckpointError(
            fmt::format("{}: sub-part of {} along dim {} does not split over {} "
                        "tensor-parallel ranks",
                        name, part, dim, t));
      out.push_back({begin + rank * (part / t), part / t});
      begin += part;
    }
    if (begin != full)
      throw CheckpointError(
          fmt::format("{}: sub_param_sizes [{}] sum to {}, not the logical "
                      "size {} along dim {}",
                      name, fmt::join(p.sub_param_sizes, ", "), begin, full, dim));
    return out;
  }
  if (!p.partition_sizes.empty()) {
    const int64_t sum =
        std::accumulate(p.partition_sizes.begin(), p.partition_sizes.end(), int64_t{0});
    if (sum != full)
      throw CheckpointError(
          fmt::format("{}: partition_sizes sum to {}, not the logical size {}", name, sum, full));
    const int64_t begin =
        std::accumulate(p.partition_sizes.begin(), p.partition_sizes.begin() + rank, int64_t{0});
    return {{begin, p.partition_sizes.at(rank)}};
  }
  if (full % t != 0)
    throw CheckpointError(
        fmt::format("{}: size {} along dim {} does not split over {} "
                    "tensor-parallel ranks",
                    name, full, dim, t));
  return {{rank * (full / t), full / t}};
}

std::vector<int64_t> shard_shape(const ParamPartition& p, int64_t rank, const std::string& name) {
  std::vector<int64_t> shape = p.logical_shape;
  int64_t width = 0;
  for (const Piece& piece : pieces_of(p, rank, name)) width += piece.width;
  shape.at(*p.partition_dim) = width;
  return shape;
}

}  // namespace

ParamPartition tensor_parallel_partition(std::vector<int64_t> logical_shape, int64_t tp_degree,
                                         std::optional<int64_t> partition_dim, int64_t stride) {
  ParamPartition p;
  p.logical_shape = std::move(logical_shape);
  p.tp_degree = tp_degree;
  p.partition_dim = partition_dim;
  if (partition_dim && stride > 1) {
    const int64_t full = p.logical_shape.at(*partition_dim);
    if (full % stride != 0)
      throw CheckpointError(
          fmt::format("partition_stride {} does not divide the size {}", stride, full));
    p.sub_param_sizes.assign(stride, full / stride);
  }
  return p;
}

ParamPartition at_tp_degree(const ParamPartition& p, int64_t tp_degree) {
  ParamPartition q = p;
  q.tp_degree = tp_degree;
  q.partition_sizes.clear();
  return q;
}

at::Tensor merge_tp_shards(const std::vector<at::Tensor>& shards, const ParamPartition& p,
                           const std::string& name) {
  if (static_cast<int64_t>(shards.size()) != p.tp_degree)
    throw CheckpointError(
        fmt::format("{}: {} shards for tp_degree {}", name, shards.size(), p.tp_degree));
  if (!p.partition_dim) {
    if (shards[0].sizes().vec() != p.logical_shape)
      throw CheckpointError(fmt::format("{}: replicated tensor of shape [{}], expected [{}]", name,
                                        fmt::join(shards[0].sizes(), ", "),
                                        fmt::join(p.logical_shape, ", ")));
    return shards[0];
  }
  const int64_t dim = *p.partition_dim;
  at::Tensor whole = at::empty(p.logical_shape, shards[0].options());
  for (int64_t r = 0; r < p.tp_degree; ++r) {
    const at::Tensor& s = shards[r];
    if (s.sizes().vec() != shard_shape(p, r, name))
      throw CheckpointError(
          fmt::format("{}: tensor-parallel rank {}'s shard has shape [{}], "
                      "expected [{}] (logical [{}] cut along dim {} over {})",
                      name, r, fmt::join(s.sizes(), ", "), fmt::join(shard_shape(p, r, name), ", "),
                      fmt::join(p.logical_shape, ", "), dim, p.tp_degree));
    int64_t at_shard = 0;
    for (const Piece& piece : pieces_of(p, r, name)) {
      whole.narrow(dim, piece.begin, piece.width).copy_(s.narrow(dim, at_shard, piece.width));
      at_shard += piece.width;
    }
  }
  return whole;
}

at::Tensor tp_shard(const at::Tensor& logical, const ParamPartition& p, int64_t rank,
                    const std::string& name) {
  if (logical.sizes().vec() != p.logical_shape)
    throw CheckpointError(fmt::format("{}: tensor of shape [{}], expected the logical [{}]", name,
                                      fmt::join(logical.sizes(), ", "),
                                      fmt::join(p.logical_shape, ", ")));
  if (!p.partition_dim) return logical;
  std::vector<at::Tensor> parts;
  for (const Piece& piece : pieces_of(p, rank, name))
    parts.push_back(logical.narrow(*p.partition_dim, piece.begin, piece.width));
  return at::cat(parts, *p.partition_dim).contiguous();
}

std::vector<at::Tensor> reshape_tp_shards(const std::vector<at::Tensor>& shards,
                                          const ParamPartition& p, int64_t to_degree,
                                          const std::string& name) {
  const at::Tensor whole = merge_tp_shards(shards, p, name);
  const ParamPartition q = at_tp_degree(p, to_degree);
  std::vector<at::Tensor> out;
  for (int64_t r = 0; r < to_degree; ++r) out.push_back(tp_shard(whole, q, r, name));
  return out;
}

}  // namespace dscpp::checkpoint
