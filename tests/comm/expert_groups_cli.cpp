// Prints the expert groups of topologies as JSON, for compare_expert_groups_with_deepspeed.py:
//   expert_groups_cli WORLD TENSOR PIPE EP [WORLD TENSOR PIPE EP ...]
// one line per layout: {"ep": [[...], ...], "edp": [[...], ...]} (or {"error": "..."}).
// Topology {pipe, data, model} with data = WORLD / (TENSOR * PIPE).
#include <cstdlib>
#include <iostream>

#include "dscpp/comm/expert_groups.h"

int main(int argc, char** argv) {
  if (argc < 5 || (argc - 1) % 4 != 0) {
    std::cerr << "usage: expert_groups_cli WORLD TENSOR PIPE EP [WORLD TENSOR PIPE EP ...]\n";
    return 2;
  }
  for (int a = 1; a < argc; a += 4) {
    const int world = std::atoi(argv[a]), t = std::atoi(argv[a + 1]), p = std::atoi(argv[a + 2]),
              ep = std::atoi(argv[a + 3]);
    try {
      dscpp::comm::Topology topo({"pipe", "data", "model"}, {p, world / (t * p), t});
      auto lists = dscpp::comm::expert_parallel_comm_lists(topo, ep);
      auto print = [](const std::vector<std::vector<int>>& groups) {
        std::cout << "[";
        for (size_t g = 0; g < groups.size(); ++g) {
          std::cout << (g ? ", [" : "[");
          for (size_t k = 0; k < groups[g].size(); ++k)
            std::cout << (k ? ", " : "") << groups[g][k];
          std::cout << "]";
        }
        std::cout << "]";
      };
      std::cout << "{\"ep\": ";
      print(lists.expert_parallel);
      std::cout << ", \"edp\": ";
      print(lists.expert_data_parallel);
      std::cout << "}\n";
    } catch (const std::exception& e) {
      std::cout << "{\"error\": \"" << e.what() << "\"}\n";
    }
  }
  return 0;
}
