#include "node_plan.h"

#include <fmt/format.h>

#include "errors.h"
#include "python_program.h"

namespace dscpp::launcher {

std::vector<RankLaunch> plan_node(const NodeConfig& config) {
  const int num_nodes = static_cast<int>(config.world.size());
  if (config.node_rank < 0 || config.node_rank >= num_nodes) {
    throw UserError(fmt::format("--node_rank {} is out of range: the job has {} node(s)",
                                config.node_rank, num_nodes));
  }
  int world_size = 0;
  int first_rank = 0;
  for (int node = 0; node < num_nodes; ++node) {
    if (node == config.node_rank) first_rank = world_size;
    world_size += static_cast<int>(config.world[node].second.size());
  }
  const std::vector<int>& slots = config.world[config.node_rank].second;
  const int local_size = static_cast<int>(slots.size());

  std::string visible;
  for (size_t i = 0; i < slots.size(); ++i) visible += (i ? "," : "") + std::to_string(slots[i]);

  std::vector<int> cores;
  int cores_per_rank = 0;
  if (config.bind_cores_to_rank && local_size > 0) {
    cores = config.bind_core_list ? parse_range_list(*config.bind_core_list) : config.default_cores;
    cores_per_rank = static_cast<int>(cores.size()) / local_size;
    if (cores_per_rank < 1) {
      throw UserError(fmt::format(
          "--bind_cores_to_rank: {} core(s) cannot give each of {} local ranks at least one",
          cores.size(), local_size));
    }
  }

  std::vector<RankLaunch> ranks;
  for (int local = 0; local < local_size; ++local) {
    RankLaunch r;
    r.rank = first_rank + local;
    // DeepSpeed computes rank % local_size, which is wrong for uneven nodes; the position
    // on this node is what LOCAL_RANK must mean.
    r.local_rank = local;
    r.env = config.extra_env;
    set_env(r.env, "RANK", std::to_string(r.rank));
    set_env(r.env, "LOCAL_RANK", std::to_string(local));
    set_env(r.env, "WORLD_SIZE", std::to_string(world_size));
    set_env(r.env, "LOCAL_SIZE", std::to_string(local_size));
    set_env(r.env, "CROSS_RANK", std::to_string(config.node_rank));
    set_env(r.env, "CROSS_SIZE", std::to_string(num_nodes));
    set_env(r.env, "MASTER_ADDR", config.master_addr);
    set_env(r.env, "MASTER_PORT", std::to_string(config.master_port));
    set_env(r.env, "CUDA_VISIBLE_DEVICES", config.hide_gpus ? std::string() : visible);
    if (cores_per_rank > 0) {
      r.cpus.assign(cores.begin() + local * cores_per_rank,
                    cores.begin() + (local + 1) * cores_per_rank);
      set_env(r.env, "OMP_NUM_THREADS", std::to_string(cores_per_rank));
    }
    // A .py program: `python -u train.py --local_rank=N ...`, as DeepSpeed's launch.py.
    const auto prefix = program_prefix(config.program, config.no_python, config.python);
    r.argv.insert(r.argv.end(), prefix.begin(), prefix.end());
    // `dscpp ... python3 train.py`: the flag belongs to the script, as DeepSpeed's launcher
    // places it (python -u train.py --local_rank=N ...), not to the interpreter.
    auto args = config.program_args.begin();
    const std::string base = config.program.substr(config.program.find_last_of('/') + 1);
    if (prefix.size() == 1 && base.rfind("python", 0) == 0 && args != config.program_args.end() &&
        args->rfind("-", 0) != 0)
      r.argv.push_back(*args++);
    if (!config.no_local_rank) r.argv.push_back(fmt::format("--local_rank={}", local));
    r.argv.insert(r.argv.end(), args, config.program_args.end());
    ranks.push_back(std::move(r));
  }
  return ranks;
}

}  // namespace dscpp::launcher
