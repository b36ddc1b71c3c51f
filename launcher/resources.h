// Turns the resource pool (hosts and slot counts) into the active resources of a job: the
// slot ids used on each host, after --include/--exclude and --num_nodes/--num_gpus. Rules
// and error cases follow DeepSpeed's runner.py exactly, so a filter string means the same
// thing to `dscpp` as to `deepspeed`. Host order of the pool is always preserved because it
// fixes the global rank numbering.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "errors.h"
#include "hostfile.h"

namespace dscpp::launcher {

// Hosts in rank order with the slot (device) ids each one contributes.
using ActiveResources = std::vector<std::pair<std::string, std::vector<int>>>;

class ResourceError : public UserError {
 public:
  using UserError::UserError;
};

// Filters `hosts` by a NODE_SPEC[@NODE_SPEC ...] string, NODE_SPEC = NAME[:SLOT[,SLOT ...]].
// At most one of include/exclude may be non-empty. Throws ResourceError for unknown hosts,
// unknown slots, malformed specs, or both strings set.
ActiveResources parse_resource_filter(const ActiveResources& hosts, const std::string& include,
                                      const std::string& exclude);

// Expands slot counts into ids [0, N) and applies parse_resource_filter.
ActiveResources parse_inclusion_exclusion(const ResourcePool& pool, const std::string& include,
                                          const std::string& exclude);

// Keeps the first `num_nodes` hosts (when > 0) and gives each host slots [0, num_gpus)
// (when > 0), as DeepSpeed does even if a host has fewer devices.
ActiveResources apply_num_nodes_and_gpus(ActiveResources active, int num_nodes, int num_gpus);

// Parses "1,3-5,7" into {1,3,4,5,7}; sub-ranges must ascend without overlap (DeepSpeed's
// --bind_core_list syntax). Throws ResourceError otherwise.
std::vector<int> parse_range_list(const std::string& text);

}  // namespace dscpp::launcher
