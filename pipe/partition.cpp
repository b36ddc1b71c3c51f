// DeepSpeed's partition_uniform, partition_balanced and _partition_layers' method dispatch.
#include "dscpp/pipe/partition.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <limits>
#include <regex>

namespace dscpp::pipe {

std::vector<int> partition_uniform(int num_items, int num_parts) {
  if (num_parts < 1)
    throw PartitionError(
        fmt::format("pipeline partition: num_stages must be >= 1, found {}", num_parts));
  if (num_items < 0) throw PartitionError(fmt::format("pipeline partition: {} layers", num_items));
  std::vector<int> parts(num_parts + 1);
  if (num_items <= num_parts) {
    for (int p = 0; p <= num_parts; ++p) parts[p] = std::min(p, num_items);
    return parts;
  }
  const int chunk = num_items / num_parts, residual = num_items - chunk * num_parts;
  for (int p = 0; p <= num_parts; ++p) parts[p] = p * chunk + std::min(p, residual);
  return parts;
}

// The dynamic programme of DeepSpeed's partition_balanced, kept step for step (float64
// sums, infinities for unreachable cells, ties going to the later split as its `>=` does)
// so that ties break as DeepSpeed's do. O(n^2 p).
std::vector<int> partition_balanced(const std::vector<std::int64_t>& weights, int num_parts) {
  const int n = static_cast<int>(weights.size()), m = num_parts;
  if (m < 1)
    throw PartitionError(fmt::format("pipeline partition: num_stages must be >= 1, found {}", m));
  if (n <= m) return partition_uniform(n, m);
  const double inf = std::numeric_limits<double>::infinity();
  const size_t w = static_cast<size_t>(m) + 1;
  std::vector<double> dp_max((n + 1) * w, inf), dp_min((n + 1) * w, inf), dp_cost((n + 1) * w, inf);
  std::vector<int> position((n + 1) * w, 0);
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + static_cast<double>(weights[i]);
  auto at = [w](int i, int j) { return static_cast<size_t>(i) * w + j; };
  dp_max[at(0, 0)] = 0;
  dp_cost[at(0, 0)] = 0;
  for (int i = 1; i <= n; ++i) {
    for (int j = 1; j <= std::min(i, m); ++j) {
      for (int k = 0; k < i; ++k) {
        const double segment = prefix[i] - prefix[k];
        const double max_sum = std::max(dp_max[at(k, j - 1)], segment);
        const double min_sum = std::min(dp_min[at(k, j - 1)], segment);
        const double cost = max_sum - min_sum;
        if (dp_cost[at(i, j)] >= cost) {
          dp_cost[at(i, j)] = cost;
          dp_max[at(i, j)] = max_sum;
          dp_min[at(i, j)] = min_sum;
          position[at(i, j)] = k;
        }
      }
    }
  }
  std::vector<int> parts{n};
  for (int i = m; i >= 1; --i) parts.push_back(position[at(parts.back(), i)]);
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<int> partition_layers(const std::string& method_in,
                                  const std::vector<LayerInfo>& layers, int num_stages) {
  std::string method = method_in;
  std::transform(method.begin(), method.end(), method.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  const int n = static_cast<int>(layers.size());
  if (method == "uniform") return partition_uniform(n, num_stages);
  if (method == "parameters") {
    std::vector<std::int64_t> counts;
    for (const LayerInfo& l : layers) counts.push_back(l.trainable_params);
    return partition_balanced(counts, num_stages);
  }
  if (method.rfind("type:", 0) == 0) {
    const std::string rest = method.substr(5);
    const std::string pattern = rest.substr(0, rest.find(':'));
    std::regex re;
    try {
      re = std::regex(pattern, std::regex::ECMAScript | std::regex::icase);
    } catch (const std::regex_error& e) {
      throw PartitionError(
          fmt::format("pipeline partition_method '{}': '{}' is not a valid regex ({})", method_in,
                      pattern, e.what()));
    }
    std::vector<std::int64_t> binary(n, 0);
    bool any = false;
    for (int i = 0; i < n; ++i)
      // A layer without a type name (DeepSpeed: an object without __name__) never matches.
      if (!layers[i].type_name.empty() && std::regex_search(layers[i].type_name, re))
        binary[i] = 1, any = true;
    if (!any)
      throw PartitionError(
          fmt::format("pipeline partition_method '{}': Partitioning '{}' found no valid layers to "
                      "partition (no layer type name matches, case-insensitive)",
                      method_in, pattern));
    return partition_balanced(binary, num_stages);
  }
  throw PartitionError(
      fmt::format("pipeline partition_method '{}' is not implemented: expected 'parameters' (the "
                  "default), 'uniform' or 'type:REGEX'",
                  method_in));
}

}  // namespace dscpp::pipe
