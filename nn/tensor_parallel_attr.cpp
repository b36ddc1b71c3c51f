// The parameters' tensor-parallel attributes, gathered from the modules that know them.
#include "dscpp/nn/tensor_parallel_attr.h"

#include <ATen/ATen.h>

namespace dscpp::nn {

std::map<std::string, TensorParallelAttr> tensor_parallel_attributes(
    const torch::nn::Module& root) {
  std::map<std::string, TensorParallelAttr> out;
  for (const auto& p : root.named_parameters()) out[p.key()] = {};
  for (const auto& m : root.named_modules()) {
    const auto* tp = dynamic_cast<const TensorParallelModule*>(m.value().get());
    if (!tp) continue;
    const std::string prefix = m.key().empty() ? "" : m.key() + ".";
    for (const auto& [name, attr] : tp->tensor_parallel_attributes()) {
      auto it = out.find(prefix + name);
      if (it != out.end()) it->second = attr;
    }
  }
  return out;
}

bool param_is_not_tensor_parallel_duplicate(const TensorParallelAttr& attr, int tp_rank) {
  return attr.tensor_model_parallel || tp_rank == 0;
}

void all_reduce_sequence_parallel_grads(const torch::nn::Module& root, const GroupPtr& group) {
  if (tensor_model_parallel_size(group) == 1) return;
  const auto attrs = tensor_parallel_attributes(root);
  for (const auto& p : root.named_parameters()) {
    at::Tensor grad = p.value().grad();
    if (!grad.defined() || !attrs.at(p.key()).sequence_parallel) continue;
    // Gloo and NCCL reduce dense tensors in place: a strided gradient goes through a copy.
    at::Tensor dense = grad.is_contiguous() ? grad : grad.contiguous();
    group->all_reduce(dense).wait();
    if (!dense.is_same(grad)) grad.copy_(dense);
  }
}

}  // namespace dscpp::nn
