// Topology: DeepSpeed's rank layout (row-major over the axes).
#include "dscpp/comm/topology.h"

#include <fmt/format.h>

#include <stdexcept>

#include "dscpp/error.h"

namespace dscpp::comm {

Topology::Topology(std::vector<std::string> axes, std::vector<int> dims)
    : axes_(std::move(axes)), dims_(std::move(dims)) {
  if (axes_.size() != dims_.size() || axes_.empty())
    throw dscpp::Error("Topology: one size per axis, at least one axis");
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (dims_[i] < 1)
      throw dscpp::Error(fmt::format("Topology: axis '{}' has size {}", axes_[i], dims_[i]));
    world_size_ *= dims_[i];
  }
}

size_t Topology::axis_index(const std::string& axis) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i] == axis) return i;
  throw dscpp::Error(fmt::format("Topology: no axis '{}'", axis));
}

int Topology::get_dim(const std::string& axis) const {
  return dims_[axis_index(axis)];
}

int Topology::get_rank(const std::map<std::string, int>& coord) const {
  int rank = 0;
  for (size_t i = 0; i < axes_.size(); ++i) {
    auto it = coord.find(axes_[i]);
    if (it == coord.end() || it->second < 0 || it->second >= dims_[i])
      throw dscpp::Error(fmt::format("Topology: bad or missing coordinate for '{}'", axes_[i]));
    rank = rank * dims_[i] + it->second;
  }
  return rank;
}

std::map<std::string, int> Topology::get_coord(int rank) const {
  if (rank < 0 || rank >= world_size_) throw dscpp::Error("Topology: rank out of range");
  std::map<std::string, int> coord;
  for (size_t i = axes_.size(); i-- > 0;) {
    coord[axes_[i]] = rank % dims_[i];
    rank /= dims_[i];
  }
  return coord;
}

std::vector<std::vector<int>> Topology::get_axis_comm_lists(const std::string& axis) const {
  size_t a = axis_index(axis);
  std::vector<std::vector<int>> lists;
  for (int r = 0; r < world_size_; ++r) {
    auto c = get_coord(r);
    if (c[axis] != 0) continue;  // one list per combination of the other axes
    std::vector<int> list;
    for (int k = 0; k < dims_[a]; ++k) {
      c[axis] = k;
      list.push_back(get_rank(c));
    }
    lists.push_back(list);
  }
  return lists;
}

}  // namespace dscpp::comm
