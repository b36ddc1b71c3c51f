// Ranks laid on named axes in DeepSpeed's order (ProcessTopology): the last axis varies
// fastest, so with axes {pipe, data, model} the ranks of one model-parallel group are
// consecutive. Pure arithmetic: the groups it lists are made with new_subgroup. Bad axes,
// sizes, coordinates or ranks throw CommError.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace dscpp::comm {

class Topology {
 public:
  // axes: names such as "pipe", "data", "model", "expert"; dims: their sizes.
  Topology(std::vector<std::string> axes, std::vector<int> dims);

  int world_size() const { return world_size_; }
  int get_rank(const std::map<std::string, int>& coord) const;
  std::map<std::string, int> get_coord(int rank) const;
  int get_dim(const std::string& axis) const;
  // All groups along `axis`: the lists of ranks whose coordinates differ only on `axis`.
  std::vector<std::vector<int>> get_axis_comm_lists(const std::string& axis) const;

 private:
  size_t axis_index(const std::string& axis) const;

  std::vector<std::string> axes_;
  std::vector<int> dims_;
  int world_size_ = 1;
};

}  // namespace dscpp::comm
