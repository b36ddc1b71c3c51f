// What ZeRO's buffers take, buffer by buffer: the engine's own accounting of the memory it
// allocates (EngineCore::memory_breakdown, train_gpt's start-up line). `on_device` is where a
// buffer lives on a GPU run: the training device, or the host with offload. A CPU run has one
// memory, and reports each buffer where the GPU run would put it, so that the same formula
// holds on both. Transient buffers (the reduce buckets in flight, stage 3's gathered
// buckets) count what they hold at the moment asked; GradBuckets keeps their peak.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace dscpp::zero {

struct MemoryItem {
  std::string name;
  int64_t bytes = 0;
  bool on_device = true;
};
using MemoryBreakdown = std::vector<MemoryItem>;

inline int64_t bytes_of(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

// Sums of one side (on_device) or the bytes of one name (0 when absent).
inline int64_t total_bytes(const MemoryBreakdown& m, bool on_device) {
  int64_t n = 0;
  for (const auto& i : m) n += i.on_device == on_device ? i.bytes : 0;
  return n;
}
inline int64_t bytes_named(const MemoryBreakdown& m, const std::string& name) {
  int64_t n = 0;
  for (const auto& i : m) n += i.name == name ? i.bytes : 0;
  return n;
}

// One line: "device X GiB (name a, name b, ...); host Y GiB (...)", same names summed, empty
// ones left out.
inline std::string describe(const MemoryBreakdown& m) {
  auto gib = [](int64_t b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(b) / (1 << 30));
    return std::string(buf);
  };
  std::string out;
  for (bool device : {true, false}) {
    std::vector<std::pair<std::string, int64_t>> named;
    for (const auto& i : m) {
      if (i.on_device != device || i.bytes == 0) continue;
      bool found = false;
      for (auto& [n, b] : named)
        if (n == i.name) b += i.bytes, found = true;
      if (!found) named.emplace_back(i.name, i.bytes);
    }
    out += std::string(device ? "device " : "; host ") + gib(total_bytes(m, device)) + " GiB (";
    for (size_t k = 0; k < named.size(); ++k)
      out += (k ? ", " : "") + named[k].first + " " + gib(named[k].second);
    out += ")";
  }
  return out;
}

}  // namespace dscpp::zero
