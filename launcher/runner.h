// The two ways the `dscpp` binary runs. run_runner is what a user types: it resolves the
// job (launch_plan.h) and either starts this node's ranks or runs a multi-node backend.
// run_node_mode is the internal per-node launcher that backends start on each host with
// --world_info. Both return the process exit code and throw UserError for usage problems.
#pragma once

#include "options.h"

namespace dscpp::launcher {

int run_runner(const Options& options);
int run_node_mode(const Options& options);

}  // namespace dscpp::launcher
