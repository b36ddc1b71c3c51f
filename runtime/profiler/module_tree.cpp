// ModuleTree: see module_tree.h.
#include "dscpp/runtime/profiler/module_tree.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/nn/modules/container/moduledict.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <typeinfo>
#include <unordered_set>

namespace dscpp::profiler {

namespace {

const char* py_bool(bool b) {
  return b ? "True" : "False";
}

// PyTorch's extra_repr for the LibTorch modules that have a Python twin; "" for the others.
std::string extra_repr_of(const torch::nn::Module& m) {
  if (const auto* l = dynamic_cast<const torch::nn::LinearImpl*>(&m)) {
    const auto& o = l->options;
    return fmt::format("in_features={}, out_features={}, bias={}", o.in_features(),
                       o.out_features(), py_bool(o.bias()));
  }
  if (const auto* n = dynamic_cast<const torch::nn::LayerNormImpl*>(&m)) {
    const auto& o = n->options;
    const auto& shape = o.normalized_shape();
    std::string tuple = "(";
    for (size_t i = 0; i < shape.size(); ++i) tuple += fmt::format("{}{}", i ? ", " : "", shape[i]);
    tuple += shape.size() == 1 ? ",)" : ")";
    return fmt::format("{}, eps={}, elementwise_affine={}", tuple, o.eps(),
                       py_bool(o.elementwise_affine()));
  }
  if (const auto* e = dynamic_cast<const torch::nn::EmbeddingImpl*>(&m)) {
    const auto& o = e->options;
    std::string s = fmt::format("{}, {}", o.num_embeddings(), o.embedding_dim());
    if (o.padding_idx()) s += fmt::format(", padding_idx={}", *o.padding_idx());
    return s;
  }
  return "";
}

bool is_container(const torch::nn::Module& m) {
  return typeid(m) == typeid(torch::nn::Module) ||
         dynamic_cast<const torch::nn::ModuleListImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::SequentialImpl*>(&m) != nullptr ||
         dynamic_cast<const torch::nn::ModuleDictImpl*>(&m) != nullptr;
}

}  // namespace

std::string python_class_name(const torch::nn::Module& module) {
  std::string name = c10::demangle(typeid(module).name());
  if (const size_t angle = name.find('<'); angle != std::string::npos) name.resize(angle);
  if (const size_t colon = name.rfind("::"); colon != std::string::npos)
    name = name.substr(colon + 2);
  if (name.size() > 4 && name.compare(name.size() - 4, 4, "Impl") == 0)
    name.resize(name.size() - 4);
  return name;
}

ModuleTree::ModuleTree(const torch::nn::Module& root) {
  add(root, "", "", -1);
  // Parameters per node, each tensor once however often it is registered below the node.
  for (int i = static_cast<int>(nodes_.size()) - 1; i >= 0; --i) {
    std::unordered_set<const c10::TensorImpl*> seen;
    std::vector<int> todo = {i};
    while (!todo.empty()) {
      const int n = todo.back();
      todo.pop_back();
      for (const auto& p : nodes_[static_cast<size_t>(n)].module->parameters(/*recurse=*/false))
        if (seen.insert(p.unsafeGetTensorImpl()).second)
          nodes_[static_cast<size_t>(i)].params += p.numel();
      for (int c : nodes_[static_cast<size_t>(n)].children) todo.push_back(c);
    }
  }
}

int ModuleTree::add(const torch::nn::Module& module, const std::string& key,
                    const std::string& path, int parent) {
  const int index = static_cast<int>(nodes_.size());
  ModuleNode node;
  node.key = key;
  node.path = path;
  node.type = python_class_name(module);
  node.extra_repr = extra_repr_of(module);
  node.module = &module;
  node.parent = parent;
  node.container = is_container(module);
  auto [it, fresh] = node_of_.emplace(&module, index);
  if (fresh) {
    node.counters = static_cast<int>(counters_.size());
    counters_.emplace_back();
    for (const auto& p : module.parameters(/*recurse=*/false))
      owner_.emplace(p.unsafeGetTensorImpl(), index);
  } else {
    node.counters = nodes_[static_cast<size_t>(it->second)].counters;
  }
  nodes_.push_back(std::move(node));
  for (const auto& child : module.named_children()) {
    const int c = add(*child.value(), child.key(),
                      path.empty() ? child.key() : path + "." + child.key(), index);
    nodes_[static_cast<size_t>(index)].children.push_back(c);
  }
  return index;
}

void ModuleTree::reset_counters() {
  for (auto& c : counters_) c = ModuleCounters();
}

int ModuleTree::node_of(const torch::nn::Module* module) const {
  auto it = node_of_.find(module);
  return it == node_of_.end() ? -1 : it->second;
}

int ModuleTree::owner_of_parameter(const c10::TensorImpl* param) const {
  auto it = owner_.find(param);
  return it == owner_.end() ? -1 : it->second;
}

namespace {
// The distinct counter sets of a node and its descendants.
std::vector<int> counters_below(const ModuleTree& tree, int node) {
  std::unordered_set<int> seen;
  std::vector<int> out, todo = {node};
  while (!todo.empty()) {
    const int n = todo.back();
    todo.pop_back();
    if (seen.insert(tree.node(n).counters).second) out.push_back(tree.node(n).counters);
    for (int c : tree.node(n).children) todo.push_back(c);
  }
  return out;
}
}  // namespace

int64_t ModuleTree::flops(int node) const {
  int64_t sum = 0;
  for (int c : counters_below(*this, node)) sum += counters_[static_cast<size_t>(c)].flops;
  return sum;
}

int64_t ModuleTree::macs(int node) const {
  int64_t sum = 0;
  for (int c : counters_below(*this, node)) sum += counters_[static_cast<size_t>(c)].macs;
  return sum;
}

double ModuleTree::duration(int node) const {
  double d = counters_of(node).duration;
  if (d == 0)
    for (int c : nodes_[static_cast<size_t>(node)].children) d += duration(c);
  return d;
}

}  // namespace dscpp::profiler
