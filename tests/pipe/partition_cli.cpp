// Prints pipe::partition_layers' boundaries for cases read from stdin, one per line:
//   METHOD NUM_STAGES N TYPE_1 PARAMS_1 ... TYPE_N PARAMS_N   (TYPE "-": no type name)
// Output, one line per case: the boundaries, or "error: <message>".
// tests/pipe/compare_partition.py compares them with DeepSpeed's own _partition_layers.
#include <iostream>
#include <sstream>
#include <string>

#include "dscpp/pipe/partition.h"

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string method;
    int stages = 0, n = 0;
    in >> method >> stages >> n;
    std::vector<dscpp::pipe::LayerInfo> layers(n);
    for (auto& l : layers) {
      in >> l.type_name >> l.trainable_params;
      if (l.type_name == "-") l.type_name.clear();
    }
    try {
      const auto parts = dscpp::pipe::partition_layers(method, layers, stages);
      for (size_t i = 0; i < parts.size(); ++i) std::cout << (i ? " " : "") << parts[i];
      std::cout << "\n";
    } catch (const dscpp::Error& e) {
      std::cout << "error: " << e.what() << "\n";
    }
  }
  return 0;
}
