// dscpp: DeepSpeed's `deepspeed` launcher for native programs. See README.md.
#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "errors.h"
#include "options.h"
#include "runner.h"

int main(int argc, char** argv) {
  using namespace dscpp::launcher;
  try {
    const Options options = parse_options(std::vector<std::string>(argv + 1, argv + argc));
    if (options.help) {
      fmt::print("{}", usage_text());
      return 0;
    }
    return options.world_info ? run_node_mode(options) : run_runner(options);
  } catch (const UserError& e) {
    fmt::print(stderr, "dscpp: error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dscpp: internal error: {}\n", e.what());
    return 1;
  }
}
