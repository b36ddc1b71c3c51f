// Partition methods: see partition_methods.h.
#include "dscpp/pipe/partition_methods.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <regex>

#include "dscpp/error.h"

namespace dscpp::pipe {

std::vector<int> partition_uniform(int items, int parts) {
  std::vector<int> bounds(parts + 1, 0);
  const int chunk = items / parts, extra = items % parts;
  for (int k = 0; k < parts; ++k) bounds[k + 1] = bounds[k] + chunk + (k < extra ? 1 : 0);
  return bounds;
}

namespace {

// Whether weights split into `parts` non-empty contiguous parts of sum <= cap each; the
// greedy cut (as late as possible, leaving one item per remaining part) fills `bounds`.
bool fits(const std::vector<double>& w, int parts, double cap, std::vector<int>* bounds) {
  const int n = static_cast<int>(w.size());
  std::vector<int> b{0};
  int i = 0;
  for (int k = 0; k < parts; ++k) {
    double sum = 0;
    const int last_allowed = n - (parts - k - 1);  // leave an item for each later part
    int j = i;
    while (j < last_allowed && (j == i || sum + w[j] <= cap)) {
      if (w[j] > cap) return false;
      sum += w[j++];
    }
    if (k == parts - 1 && j < n) return false;
    b.push_back(j);
    i = j;
  }
  if (bounds) *bounds = b;
  return i == n;
}

}  // namespace

std::vector<int> partition_balanced(const std::vector<double>& weights, int parts) {
  const int n = static_cast<int>(weights.size());
  if (parts < 1 || n < parts)
    throw Error(fmt::format("partition: {} layers cannot fill {} non-empty parts", n, parts));
  // The answer is one of the contiguous sums: search their sorted list for the smallest cap
  // that fits.
  std::vector<double> sums;
  for (int i = 0; i < n; ++i) {
    double s = 0;
    for (int j = i; j < n; ++j) sums.push_back(s += weights[j]);
  }
  std::sort(sums.begin(), sums.end());
  sums.erase(std::unique(sums.begin(), sums.end()), sums.end());
  size_t lo = 0, hi = sums.size() - 1;
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (fits(weights, parts, sums[mid], nullptr))
      hi = mid;
    else
      lo = mid + 1;
  }
  std::vector<int> bounds;
  fits(weights, parts, sums[lo], &bounds);
  return bounds;
}

std::vector<int> partition_layers(const std::vector<nn::LayerSpec>& specs, int parts,
                                  const std::string& method) {
  const int n = static_cast<int>(specs.size());
  std::string m = method;
  std::transform(m.begin(), m.end(), m.begin(), [](unsigned char c) { return std::tolower(c); });
  if (m == "uniform") return partition_uniform(n, parts);
  std::vector<double> weights;
  if (m == "parameters") {
    // DeepSpeed counts each spec's trainable parameters by building it once.
    for (const auto& s : specs) {
      double count = 0;
      for (const auto& p : s.build()->parameters(/*recurse=*/true))
        if (p.requires_grad()) count += static_cast<double>(p.numel());
      weights.push_back(count);
    }
  } else if (m.rfind("type:", 0) == 0) {
    std::regex pattern(method.substr(5), std::regex::icase);
    for (const auto& s : specs) {
      // A module's name() is its demangled class name ("dscpp::model_zoo::GPTBlockImpl").
      const std::string type = s.build()->name();
      weights.push_back(std::regex_search(type, pattern) ? 1.0 : 0.0);
    }
    if (std::accumulate(weights.begin(), weights.end(), 0.0) == 0)
      throw Error(fmt::format("partition_method '{}': no layer's module type matches", method));
  } else {
    throw Error(fmt::format(
        "partition_method '{}': expected \"parameters\", \"uniform\" or \"type:REGEX\"", method));
  }
  return partition_balanced(weights, parts);
}

}  // namespace dscpp::pipe
