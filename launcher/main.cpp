// dscpp: DeepSpeed's `deepspeed` launcher for native programs. See README.md.
#include <exception>
#include <string>
#include <vector>

#include "errors.h"
#include "options.h"
#include "output.h"
#include "runner.h"

int main(int argc, char** argv) {
  using namespace dscpp::launcher;
  // A reader that closed its end of our output (`dscpp ... | head`) must not kill the launcher
  // before it has stopped the ranks; every message goes through output.h, which never throws.
  ignore_sigpipe();
  try {
    const Options options = parse_options(std::vector<std::string>(argv + 1, argv + argc));
    if (options.help) {
      say_out("{}", usage_text());
      return 0;
    }
    return options.world_info ? run_node_mode(options) : run_runner(options);
  } catch (const UserError& e) {
    say("dscpp: error: {}\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    say("dscpp: internal error: {}\n", e.what());
    return 1;
  }
}
