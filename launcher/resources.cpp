#include "resources.h"

#include <fmt/format.h>

#include <algorithm>

namespace dscpp::launcher {
namespace {

int parse_int(const std::string& text, const std::string& context) {
  // Python's int() also accepts surrounding blanks and a sign; both reach the range checks
  // below anyway, so only plain decimal numbers are worth supporting here.
  if (text.empty() || text.size() > 9 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    throw ResourceError(fmt::format("invalid number '{}' in '{}'", text, context));
  }
  return std::stoi(text);
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t pos = text.find(sep, start);
    parts.push_back(text.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return parts;
}

// NAME -> sorted unique slots; an empty list means "the whole host". Specs naming the same
// host merge, as in DeepSpeed (so `h:1@h:0,1` is `h:0,1`).
std::vector<std::pair<std::string, std::vector<int>>> parse_node_config_list(
    const std::string& spec) {
  std::vector<std::pair<std::string, std::vector<int>>> configs;
  for (const auto& node : split(spec, '@')) {
    std::string host = node;
    std::vector<int> slots;
    if (node.find(':') != std::string::npos) {
      auto parts = split(node, ':');
      if (parts.size() != 2) throw ResourceError(fmt::format("malformed node spec '{}'", node));
      host = parts[0];
      for (const auto& slot : split(parts[1], ',')) slots.push_back(parse_int(slot, node));
    }
    auto it = std::find_if(configs.begin(), configs.end(),
                           [&](const auto& entry) { return entry.first == host; });
    if (it == configs.end()) {
      configs.emplace_back(host, slots);
    } else {
      it->second.insert(it->second.end(), slots.begin(), slots.end());
    }
  }
  for (auto& [host, slots] : configs) {
    std::sort(slots.begin(), slots.end());
    slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
  }
  return configs;
}

const std::vector<int>* find_host(const ActiveResources& hosts, const std::string& name) {
  for (const auto& [host, slots] : hosts) {
    if (host == name) return &slots;
  }
  return nullptr;
}

}  // namespace

ActiveResources parse_resource_filter(const ActiveResources& hosts, const std::string& include,
                                      const std::string& exclude) {
  if (!include.empty() && !exclude.empty()) {
    throw ResourceError("--include and --exclude are mutually exclusive");
  }
  if (include.empty() && exclude.empty()) return hosts;

  const bool including = !include.empty();
  // Including builds the result from nothing; excluding removes from a full copy.
  ActiveResources filtered = including ? ActiveResources{} : hosts;
  auto filtered_slots = [&](const std::string& name) -> std::vector<int>& {
    for (auto& [host, slots] : filtered) {
      if (host == name) return slots;
    }
    filtered.emplace_back(name, std::vector<int>{});
    return filtered.back().second;
  };

  for (const auto& [host, slots] : parse_node_config_list(including ? include : exclude)) {
    const std::vector<int>* available = find_host(hosts, host);
    if (available == nullptr) {
      throw ResourceError(fmt::format("Hostname '{}' not found in hostfile", host));
    }
    for (int slot : slots) {
      if (std::find(available->begin(), available->end(), slot) == available->end()) {
        throw ResourceError(fmt::format("No slot '{}' specified on host '{}'", slot, host));
      }
    }
    std::vector<int>& target = filtered_slots(host);
    if (slots.empty()) {
      target = including ? *available : std::vector<int>{};
    } else if (including) {
      target = slots;
    } else {
      for (int slot : slots)
        target.erase(std::remove(target.begin(), target.end(), slot), target.end());
    }
  }

  // Back to pool order, dropping hosts left without slots.
  ActiveResources ordered;
  for (const auto& [host, unused] : hosts) {
    if (const std::vector<int>* slots = find_host(filtered, host); slots && !slots->empty()) {
      ordered.emplace_back(host, *slots);
    }
  }
  return ordered;
}

ActiveResources parse_inclusion_exclusion(const ResourcePool& pool, const std::string& include,
                                          const std::string& exclude) {
  ActiveResources active;
  for (const auto& [host, count] : pool) {
    std::vector<int> slots(static_cast<size_t>(std::max(count, 0)));
    for (int i = 0; i < count; ++i) slots[i] = i;
    active.emplace_back(host, std::move(slots));
  }
  return parse_resource_filter(active, include, exclude);
}

ActiveResources apply_num_nodes_and_gpus(ActiveResources active, int num_nodes, int num_gpus) {
  if (num_nodes > 0 && static_cast<size_t>(num_nodes) < active.size()) active.resize(num_nodes);
  if (num_gpus > 0) {
    for (auto& [host, slots] : active) {
      slots.resize(num_gpus);
      for (int i = 0; i < num_gpus; ++i) slots[i] = i;
    }
  }
  return active;
}

std::vector<int> parse_range_list(const std::string& text) {
  std::vector<int> numbers;
  int last = -1;
  for (const auto& part : split(text, ',')) {
    int first = 0, end = 0;
    auto dash = part.find('-');
    if (dash == std::string::npos) {
      first = end = parse_int(part, text);
    } else {
      auto bounds = split(part, '-');
      if (bounds.size() != 2) {
        throw ResourceError(fmt::format(
            "bad range '{}': a range is a number or two numbers separated by a dash", part));
      }
      first = parse_int(bounds[0], text);
      end = parse_int(bounds[1], text);
      if (first > end) {
        throw ResourceError(
            fmt::format("bad range '{}': the end must not be below the start", part));
      }
    }
    if (first <= last) {
      throw ResourceError(
          fmt::format("bad range list '{}': sub-ranges must ascend and must not overlap", text));
    }
    for (int i = first; i <= end; ++i) numbers.push_back(i);
    last = end;
  }
  return numbers;
}

}  // namespace dscpp::launcher
