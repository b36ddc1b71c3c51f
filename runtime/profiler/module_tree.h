// ModuleTree: a snapshot of a LibTorch module hierarchy for the flops profiler: every module
// under its name (named_children, in registration order, as PyTorch's repr walks them), its
// class name as Python would print it ("GPTBlock" for dscpp::model_zoo::GPTBlockImpl), its
// parameter count, and the counters the profiler fills in (flops, MACs and forward time
// counted in the module itself; its children's are summed on the way up, as DeepSpeed's
// get_module_flops / get_module_duration do). A module registered under two names appears
// twice in the tree and shares one set of counters, as one Python object would.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace dscpp::profiler {

struct ModuleCounters {
  int64_t flops = 0, macs = 0;  // of the operators run in this module itself
  double duration = 0;          // seconds of forward in this module (0: never timed)
  int open = 0;                 // scopes of this module open now (a module inside itself)
  double opened_at = 0;         // when the outermost of them opened
};

struct ModuleNode {
  std::string key;         // the name under its parent ("attn"); "" for the root
  std::string path;        // dotted from the root ("blocks.0.attn"); "" for the root
  std::string type;        // class name without namespace or "Impl"
  std::string extra_repr;  // PyTorch's extra_repr of the LibTorch modules we know, else ""
  const torch::nn::Module* module = nullptr;
  int parent = -1;
  std::vector<int> children;  // node indices, in registration order
  int counters = 0;           // index into ModuleTree::counters
  int64_t params = 0;         // parameters of this module and below, each counted once
  // A container without a forward of its own (ModuleList, Sequential, ModuleDict, a bare
  // torch::nn::Module): operators on its children's parameters belong to those children.
  bool container = false;
};

class ModuleTree {
 public:
  explicit ModuleTree(const torch::nn::Module& root);

  const std::vector<ModuleNode>& nodes() const { return nodes_; }
  const ModuleNode& node(int i) const { return nodes_[static_cast<size_t>(i)]; }
  std::vector<ModuleCounters>& counters() { return counters_; }
  const ModuleCounters& counters_of(int node) const {
    return counters_[static_cast<size_t>(nodes_[static_cast<size_t>(node)].counters)];
  }
  void reset_counters();

  // The (first) node of a module, or -1 when it is not in the tree.
  int node_of(const torch::nn::Module* module) const;
  // The node of the module that registered this parameter itself, or -1.
  int owner_of_parameter(const c10::TensorImpl* param) const;

  // DeepSpeed's get_module_flops / get_module_macs: the node's own and its descendants',
  // each module counted once. get_module_duration: its own time, or when it has none (a
  // ModuleList), its children's summed.
  int64_t flops(int node) const;
  int64_t macs(int node) const;
  double duration(int node) const;

 private:
  int add(const torch::nn::Module& module, const std::string& key, const std::string& path,
          int parent);

  std::vector<ModuleNode> nodes_;
  std::vector<ModuleCounters> counters_;
  std::unordered_map<const torch::nn::Module*, int> node_of_;
  std::unordered_map<const c10::TensorImpl*, int> owner_;
};

// Python's class name for a LibTorch module: the demangled C++ name without namespaces,
// template arguments or a trailing "Impl" ("torch::nn::LayerNormImpl" -> "LayerNorm").
std::string python_class_name(const torch::nn::Module& module);

}  // namespace dscpp::profiler
