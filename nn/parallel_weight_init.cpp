// The master weight drawn whole, then cut for a rank.
#include "dscpp/nn/parallel_weight_init.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dscpp/nn/normal_init.h"
#include "dscpp/nn/tensor_parallel_mappings.h"

namespace dscpp::nn {

InitMethod init_method_normal(double std) {
  return [std](const at::Tensor& t) { normal_init(t, std); };
}

at::Tensor partition_of(const at::Tensor& full, int64_t partition_dim, int64_t stride, int rank,
                        int world) {
  const int64_t size = full.size(partition_dim);
  if (stride < 1 || world < 1 || size % (world * stride) != 0)
    throw TensorParallelError(fmt::format(
        "tensor parallelism: dimension {} of size {} (shape [{}]) does not split into {} ranks "
        "x stride {}",
        partition_dim, size, fmt::join(full.sizes(), ", "), world, stride));
  // Megatron: split into pieces of size / (world * stride); rank r takes r, r + world, ...
  std::vector<at::Tensor> pieces = full.chunk(world * stride, partition_dim);
  std::vector<at::Tensor> mine;
  for (size_t i = rank; i < pieces.size(); i += world) mine.push_back(pieces[i]);
  return at::cat(mine, partition_dim).contiguous();
}

at::Tensor initialize_affine_weight(const std::vector<int64_t>& full_shape, int64_t partition_dim,
                                    int64_t stride, int rank, int world,
                                    const InitMethod& init_method,
                                    const at::TensorOptions& options) {
  at::Tensor master = at::empty(full_shape, at::TensorOptions().dtype(at::kFloat));
  init_method(master);
  return partition_of(master, partition_dim, stride, rank, world).to(options);
}

}  // namespace dscpp::nn
