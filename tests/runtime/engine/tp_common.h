// Shared by the tensor-parallel engine tests (tp_engine.cpp, tp_checkpoint.cpp): the tiny GPT,
// the (data, model) groups of a world laid out by comm::Topology, the batches, and the
// tolerant comparisons (rank_checks.h). Header-only, test code.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/comm/topology.h"
#include "dscpp/model_zoo/gpt_config.h"
#include "tests/rank_checks.h"

namespace tp_test {

using rank_checks::check, rank_checks::check_close, rank_checks::failures, rank_checks::rel_err;

inline dscpp::model_zoo::GPTConfig tiny(int t, bool sp) {
  dscpp::model_zoo::GPTConfig c;
  c.hidden_size = 64;
  c.num_layers = 2;
  c.num_attention_heads = 4;
  c.seq_length = 16;
  c.vocab_size = 128;
  c.hidden_dropout = 0;
  c.attention_dropout = 0;
  c.parallelism.tensor_model_parallel_size = t;
  c.parallelism.sequence_parallel = sp;
  return c;
}

// This rank's groups in the layout pipe 1 x data d x model t (model fastest), and a group of
// this rank alone (for the one-rank reference). Collective over `world`.
struct Groups {
  std::shared_ptr<dscpp::comm::ProcessGroup> data, model, self;
  int d = 1, t = 1, dp_rank = 0, tp_rank = 0;
};
inline Groups make_groups(dscpp::comm::ProcessGroup& world, int t) {
  Groups g;
  g.t = t;
  g.d = world.size() / t;
  dscpp::comm::Topology topo({"pipe", "data", "model"}, {1, g.d, t});
  for (const auto& ranks : topo.get_axis_comm_lists("model"))
    if (auto sub = world.new_subgroup(ranks)) g.model = sub;
  for (const auto& ranks : topo.get_axis_comm_lists("data"))
    if (auto sub = world.new_subgroup(ranks)) g.data = sub;
  for (int r = 0; r < world.size(); ++r)
    if (auto sub = world.new_subgroup({r})) g.self = sub;
  const auto coord = topo.get_coord(world.rank());
  g.dp_rank = coord.at("data");
  g.tp_rank = coord.at("model");
  return g;
}

// The global batch of `step`: [rows, seq + 1] tokens, the same on every rank.
inline at::Tensor batch(int step, int64_t rows) {
  return at::randint(0, 128, {rows, 17}, at::detail::createCPUGenerator(1000 + step), at::kLong);
}

}  // namespace tp_test
