// monitor_write_events CONFIG RANK EVENTS
// Builds a MonitorMaster from the ds_config file CONFIG for global rank RANK and writes the
// events of the file EVENTS through it: one event a line, "name<TAB>step<TAB>value" with the
// value as a C99 hex float (exact); an empty line ends one write_events call. Prints the
// TensorBoard event file's path (an empty line where none is open). Errors: stderr, exit 1.
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "dscpp/config/ds_config.h"
#include "dscpp/runtime/monitor/monitor.h"

namespace mon = dscpp::monitor;

namespace {

mon::Event parse_event(const std::string& line) {
  const size_t a = line.find('\t');
  const size_t b = a == std::string::npos ? a : line.find('\t', a + 1);
  if (b == std::string::npos) throw std::runtime_error("bad event line: " + line);
  mon::Event e;
  e.name = line.substr(0, a);
  e.step = std::stoll(line.substr(a + 1, b - a - 1));
  e.value = std::strtod(line.c_str() + b + 1, nullptr);
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: monitor_write_events CONFIG RANK EVENTS\n";
    return 2;
  }
  try {
    const dscpp::DSConfig config = dscpp::load_ds_config(argv[1]);
    mon::MonitorMaster monitor(config, std::stoll(argv[2]));
    std::ifstream in(argv[3]);
    if (!in) throw std::runtime_error(std::string("cannot read ") + argv[3]);
    std::vector<mon::Event> batch;
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty()) {
        batch.push_back(parse_event(line));
        continue;
      }
      monitor.write_events(batch);
      batch.clear();
    }
    if (!batch.empty()) monitor.write_events(batch);
    std::cout << monitor.tensorboard_file() << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "monitor_write_events: " << e.what() << "\n";
    return 1;
  }
}
