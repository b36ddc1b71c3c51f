// dscpp_report: DeepSpeed's ds_report for dscpp. Alone it prints the environment; with
// --config it prints the resolved ds_config (every key, effective value) as JSON, with
// warnings and ignored features on stderr. Exit codes: 0 fine, 2 bad config or usage.
// The optimizer and scheduler params are checked by the code the engine builds them with
// (optim/), so a config this accepts is one dscpp::initialize accepts.
#include <boost/program_options.hpp>
#include <iostream>
#include <nlohmann/json.hpp>

#include "dscpp/config/config_error.h"
#include "dscpp/config/ds_config.h"
#include "dscpp/optim/lr_schedules.h"
#include "dscpp/optim/optimizer.h"
#include "dscpp/runtime/build_info.h"

namespace po = boost::program_options;

int main(int argc, char** argv) {
  po::options_description opts("dscpp_report options");
  std::string config;
  int64_t world_size = 1;
  std::vector<std::string> autos;
  opts.add_options()("help,h", "show this help")(
      "config", po::value(&config), "ds_config file (or JSON text) to resolve and print")(
      "world-size", po::value(&world_size)->default_value(1),
      "data-parallel world size for the batch-size rule")(
      "auto", po::value(&autos)->composing(),
      "KEY=VALUE: a value for an \"auto\" in the config (dotted KEY, JSON VALUE); repeatable")(
      "strict", "unknown keys are errors, not warnings");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, opts), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "dscpp_report: " << e.what() << "\n" << opts;
    return 2;
  }
  if (vm.count("help")) {
    std::cout << opts;
    return 0;
  }
  if (config.empty()) {
    std::cout << dscpp::environment_report().dump(2) << "\n";
    return 0;
  }
  dscpp::ConfigOptions options;
  options.world_size = world_size;
  options.strict = vm.count("strict") > 0;
  for (const auto& a : autos) {
    auto eq = a.find('=');
    if (eq == std::string::npos) {
      std::cerr << "dscpp_report: --auto expects KEY=VALUE, got '" << a << "'\n";
      return 2;
    }
    auto value = nlohmann::json::parse(a.substr(eq + 1), nullptr, false);
    if (value.is_discarded()) value = a.substr(eq + 1);  // a bare word is a string
    options.auto_values[a.substr(0, eq)] = value;
  }
  try {
    dscpp::DSConfig c = dscpp::load_ds_config(config, options);
    // Build what the engine would build from the config: the same checks, the same errors.
    // A schedule without an optimizer in the config drives the program's own; a stand-in
    // Adam takes its place here (schedules read only lr and betas of it).
    std::unique_ptr<dscpp::optim::Optimizer> optimizer =
        dscpp::optim::make_optimizer(c.optimizer ? *c.optimizer : dscpp::OptimizerConfig{"adam"});
    if (c.scheduler) dscpp::optim::make_scheduler(*c.scheduler, *optimizer);
    for (const auto& w : c.warnings) std::cerr << "dscpp: warning: " << w << "\n";
    for (const auto& i : c.ignored) std::cerr << "dscpp: " << i << "\n";
    std::cout << dscpp::to_json(c).dump(2) << "\n";
    return 0;
  } catch (const dscpp::Error& e) {
    std::cerr << "dscpp: config error: " << e.what() << "\n";
    return 2;
  }
}
