// Megatron's VocabParallelEmbedding: the embedding table [num_embeddings, embedding_dim] split
// by rows over a model group of t ranks, rank r holding the vocabulary range
// [r·V/t, (r+1)·V/t). Each rank looks up the tokens in its range (others masked to zero rows),
// and the partial results are all-reduced: every rank gets the whole embedding [..., dim].
// With reduce_scatter_embeddings (sequence parallelism) the input is [b, s], the result is
// transposed to sequence-first and reduce-scattered along it: this rank's [s/t, b, dim]
// (Megatron-Core's layout), which needs s divisible by t.
// num_embeddings must divide by t (pad the vocabulary: GPTConfig pads it); the table is
// initialised as parallel_weight_init.h says (t ranks hold the one-rank table's rows).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <map>
#include <string>

#include "dscpp/nn/parallel_weight_init.h"
#include "dscpp/nn/tensor_parallel_attr.h"

namespace dscpp::nn {

class VocabParallelEmbeddingImpl : public torch::nn::Module, public TensorParallelModule {
 public:
  VocabParallelEmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim, GroupPtr group,
                             const InitMethod& init_method = init_method_normal(),
                             bool reduce_scatter_embeddings = false,
                             at::ScalarType dtype = at::kFloat);
  // input: int64 token ids of any shape ([b, s] with reduce_scatter_embeddings).
  at::Tensor forward(const at::Tensor& input);
  std::map<std::string, TensorParallelAttr> tensor_parallel_attributes() const override;

  int64_t num_embeddings = 0, embedding_dim = 0;
  GroupPtr group;
  bool reduce_scatter_embeddings = false;
  int64_t vocab_start_index = 0, vocab_end_index = 0;  // this rank's rows: [start, end)
  at::Tensor weight;                                   // [num_embeddings / t, embedding_dim]
};
TORCH_MODULE(VocabParallelEmbedding);

}  // namespace dscpp::nn
