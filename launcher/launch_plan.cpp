#include "launch_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "devices.h"
#include "errors.h"
#include "multinode_runner.h"

namespace dscpp::launcher {

LaunchPlan resolve_launch(const Options& options, const std::optional<ResourcePool>& hostfile,
                          const LocalMachine& machine) {
  LaunchPlan plan;
  std::string include = options.include;
  const std::string& exclude = options.exclude;
  const bool filtered = !include.empty() || !exclude.empty();

  // Checked before CUDA_VISIBLE_DEVICES becomes an --include below, so that --num_nodes 1
  // with CUDA_VISIBLE_DEVICES set is not mistaken for a conflict.
  if ((options.num_nodes >= 0 || options.num_gpus >= 0) && filtered) {
    throw UserError("Cannot specify num_nodes/gpus with include/exclude");
  }
  if (!is_known_launcher(options.launcher)) {
    throw UserError(fmt::format(
        "unknown launcher '{}' (choose from pdsh, openmpi, mpich, slurm, ssh)", options.launcher));
  }

  bool cpu_ranks = false;
  if (hostfile) {
    plan.pool = *hostfile;
  } else {
    std::optional<std::vector<int>> visible_ids;
    const std::string visible = machine.cuda_visible_devices.value_or("");
    if (!visible.empty()) {
      const std::string detected = "Detected CUDA_VISIBLE_DEVICES=" + visible;
      if (filtered || options.num_nodes > 1 || options.num_gpus > 0) {
        plan.notices.push_back(detected +
                               " but ignoring it because one or several of "
                               "--include/--exclude/--num_gpus/--num_nodes were used");
      } else {
        visible_ids = parse_device_ids(visible);
        if (!visible_ids) {
          throw UserError(fmt::format(
              "CUDA_VISIBLE_DEVICES={} is not a list of device numbers; select devices with "
              "--include localhost:0,1,... instead",
              visible));
        }
        include = "localhost:" + visible;
        plan.notices.push_back(detected + ": setting --include=" + include);
      }
    }
    int slots = machine.cpu_accelerator ? 0 : machine.gpu_count;
    if (slots > 0 && options.num_gpus > slots) {
      // Each rank of a GPU build takes the device of its LOCAL_RANK: a rank past the last
      // GPU would die in NCCL ("invalid device ordinal") after the others had started.
      throw UserError(fmt::format(
          "--num_gpus {0}: this machine has {1} GPU{2}, and each rank needs one of its own. Ask "
          "for at most {1} (--num_gpus {1}), or start {0} CPU ranks over Gloo with "
          "DS_ACCELERATOR=cpu",
          options.num_gpus, slots, slots == 1 ? "" : "s"));
    }
    if (slots == 0) {
      // No GPU: ranks run on the CPU, as many as asked for.
      cpu_ranks = true;
      if (options.num_gpus > 0) {
        slots = options.num_gpus;
      } else if (visible_ids) {
        slots = *std::max_element(visible_ids->begin(), visible_ids->end()) + 1;
      } else if (filtered) {
        slots = machine.cpu_count;
      } else {
        slots = 1;
      }
    }
    const long long cap = static_cast<long long>(kMaxCpuRanksPerCore) * machine.cpu_count;
    if (cpu_ranks && slots > cap && !options.oversubscribe) {
      throw UserError(fmt::format(
          "no GPU found: {} CPU ranks on a machine with {} core(s) is more than {} ({} per "
          "core); pass --oversubscribe to start them anyway",
          slots, machine.cpu_count, cap, kMaxCpuRanksPerCore));
    }
    plan.pool = {{"localhost", slots}};
    if (options.num_nodes > 1) {
      throw UserError("Num nodes is >1 but no extra nodes available via hostfile");
    }
  }

  plan.active = parse_inclusion_exclusion(plan.pool, include, exclude);
  plan.active = apply_num_nodes_and_gpus(plan.active, options.num_nodes, options.num_gpus);
  // A filter can leave one host, which runs locally, so the backend must object now.
  validate_active_resources(options.launcher, plan.active);

  int total = 0;
  for (const auto& [host, slots] : plan.active) total += static_cast<int>(slots.size());
  if (total == 0) throw UserError("no resources left to launch on after filtering");

  if (options.no_ssh &&
      (options.node_rank < 0 || options.node_rank >= static_cast<int>(plan.active.size()))) {
    throw UserError(fmt::format("--no_ssh needs --node_rank in [0, {}) for this hostfile, got {}",
                                plan.active.size(), options.node_rank));
  }

  // The port of --master_port 0 is found free on this machine, after every launcher of the
  // job has started: no other host could learn it, nor check that it is free there.
  if (options.master_port == 0 && (plan.active.size() > 1 || options.force_multi)) {
    throw UserError(fmt::format(
        "--master_port 0 (a free port chosen at launch) works on one node only, and this job {}: "
        "give a fixed --master_port",
        plan.active.size() > 1 ? fmt::format("runs on {} hosts", plan.active.size())
                               : "goes through the multi-node backend (--force_multi)"));
  }
  plan.multi_node = (options.force_multi || plan.active.size() > 1) && !options.no_ssh;
  plan.master_addr = options.master_addr;
  if (!plan.multi_node) {
    plan.node_rank = options.no_ssh ? options.node_rank : 0;
    if (plan.master_addr.empty()) {
      // Every --no_ssh launcher of a job derives the same address from the same hostfile.
      plan.master_addr = options.no_ssh ? plan.active.front().first : "127.0.0.1";
    }
    if (cpu_ranks) {
      const size_t local = plan.active[plan.node_rank].second.size();
      if (machine.gpu_count > 0) {
        plan.hide_gpus = true;
        plan.notices.push_back(fmt::format(
            "DS_ACCELERATOR=cpu: starting {} CPU ranks, the GPUs hidden from them", local));
      } else {
        plan.notices.push_back(fmt::format("no GPU found, starting {} CPU ranks", local));
      }
    }
  }
  return plan;
}

}  // namespace dscpp::launcher
