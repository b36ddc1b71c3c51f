// The vocabulary-parallel embedding: masked local lookup, then the sum over the group.
#include "dscpp/nn/vocab_parallel_embedding.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace dscpp::nn {

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t num_embeddings_,
                                                       int64_t embedding_dim_, GroupPtr group_,
                                                       const InitMethod& init_method,
                                                       bool reduce_scatter_embeddings_,
                                                       at::ScalarType dtype)
    : num_embeddings(num_embeddings_),
      embedding_dim(embedding_dim_),
      group(std::move(group_)),
      reduce_scatter_embeddings(reduce_scatter_embeddings_) {
  const int t = tensor_model_parallel_size(group);
  if (num_embeddings <= 0 || embedding_dim <= 0 || num_embeddings % t != 0)
    throw TensorParallelError(fmt::format(
        "VocabParallelEmbedding: num_embeddings {} (embedding_dim {}) does not divide into {} "
        "tensor-parallel ranks: pad the vocabulary to a multiple of {}",
        num_embeddings, embedding_dim, t, t));
  const int64_t per_partition = num_embeddings / t;
  vocab_start_index = tensor_model_parallel_rank(group) * per_partition;
  vocab_end_index = vocab_start_index + per_partition;
  weight = register_parameter(
      "weight", initialize_affine_weight({num_embeddings, embedding_dim}, 0, 1,
                                         tensor_model_parallel_rank(group), t, init_method,
                                         at::TensorOptions().dtype(dtype)));
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& input) {
  if (input.scalar_type() != at::kLong)
    throw TensorParallelError(
        fmt::format("VocabParallelEmbedding: expected int64 token ids, got {}",
                    c10::toString(input.scalar_type())));
  if (reduce_scatter_embeddings && input.dim() != 2)
    throw TensorParallelError(fmt::format(
        "VocabParallelEmbedding: reduce_scatter_embeddings expects input [b, s], got {} dims",
        input.dim()));
  if (tensor_model_parallel_size(group) == 1) {
    at::Tensor out = at::embedding(weight, input);
    return reduce_scatter_embeddings ? out.transpose(0, 1).contiguous() : out;
  }
  // Tokens outside this rank's range look up row 0 and are zeroed after: the other ranks
  // contribute them to the sum.
  const at::Tensor outside = (input < vocab_start_index) | (input >= vocab_end_index);
  const at::Tensor local = at::where(outside, 0, input - vocab_start_index);
  const at::Tensor output_parallel =
      at::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0);
  if (reduce_scatter_embeddings)
    return reduce_scatter_to_sequence_parallel_region(output_parallel.transpose(0, 1).contiguous(),
                                                      group);
  return reduce_from_tensor_model_parallel_region(output_parallel, group);
}

std::map<std::string, TensorParallelAttr> VocabParallelEmbeddingImpl::tensor_parallel_attributes()
    const {
  return {{"weight", {true, 0, 1, false}}};
}

}  // namespace dscpp::nn
