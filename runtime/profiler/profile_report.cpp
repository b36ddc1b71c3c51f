// model_profile_report: DeepSpeed's print_model_profile text (profile_report.h).
#include "dscpp/runtime/profiler/profile_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace dscpp::profiler {

namespace {

// Python's round(x, 2): the correctly rounded decimal, read back as a double.
double py_round(double x) {
  const std::string s = fmt::format("{:.2f}", x);
  return std::strtod(s.c_str(), nullptr);
}

// Python's format(x, "g") (C's %g: 6 significant digits, trailing zeros dropped).
std::string py_g(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// Python's str() of a float: the shortest repr, with ".0" on a whole number.
std::string py_float(double x) {
  std::string s = fmt::format("{}", x);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

// '{:<70}  {:<8}'.format(label, value)
std::string line(const std::string& label, const std::string& value) {
  return fmt::format("{:<70}  {:<8}\n", label, value);
}

std::string percent(double part, double total) {
  return total != 0 ? py_g(py_round(100 * part / total)) : "0";
}

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

// PyTorch's _addindent.
std::string add_indent(const std::string& s, int spaces) {
  if (s.find('\n') == std::string::npos) return s;
  std::string out;
  const std::string pad(static_cast<size_t>(spaces), ' ');
  for (char c : s) {
    out += c;
    if (c == '\n') out += pad;
  }
  return out;
}

struct Totals {
  double params, macs, duration;
};

// DeepSpeed's flops_repr: the module's line in the detailed profile.
std::string flops_repr(const ModuleTree& tree, int n, const Totals& t) {
  const ModuleNode& node = tree.node(n);
  const double params = static_cast<double>(node.params);
  const double macs = static_cast<double>(tree.macs(n));
  const double flops = static_cast<double>(tree.flops(n));
  const double duration = tree.duration(n);
  std::string s =
      fmt::format("{} = {}% Params, {} = {}% MACs, {} = {}% latency, {}", params_to_string(params),
                  percent(params, t.params), macs_to_string(macs), percent(macs, t.macs),
                  duration_to_string(duration), percent(duration, t.duration),
                  flops_to_string(duration != 0 ? py_round(flops / duration) : 0));
  if (!node.extra_repr.empty()) s += ", " + node.extra_repr;
  return s;
}

// PyTorch's Module.__repr__ with DeepSpeed's extra_repr; ModuleList's own __repr__ (no
// extra_repr, repeated children collapsed into "(0-3): 4 x ...").
std::string repr(const ModuleTree& tree, int n, const Totals& t) {
  const ModuleNode& node = tree.node(n);
  std::string out = node.type + "(";
  if (node.type == "ModuleList") {
    if (node.children.empty()) return out + ")";
    std::vector<std::string> items;
    for (int c : node.children) items.push_back(repr(tree, c, t));
    std::vector<std::string> lines;
    for (size_t begin = 0; begin < items.size();) {
      size_t end = begin;
      while (end + 1 < items.size() && items[end + 1] == items[begin]) ++end;
      const std::string local =
          begin == end ? fmt::format("({}): {}", begin, items[begin])
                       : fmt::format("({}-{}): {} x {}", begin, end, end - begin + 1, items[begin]);
      lines.push_back(add_indent(local, 2));
      begin = end + 1;
    }
    out += "\n  " + join(lines, "\n  ") + "\n";
    return out + ")";
  }
  const std::string extra = flops_repr(tree, n, t);
  if (node.children.empty()) return out + extra + ")";
  std::vector<std::string> lines = {extra};
  for (int c : node.children)
    lines.push_back("(" + tree.node(c).key + "): " + add_indent(repr(tree, c, t), 2));
  out += "\n  " + join(lines, "\n  ") + "\n";
  return out + ")";
}

// Python's repr of a {str: str} dict.
std::string py_dict(const std::vector<std::pair<std::string, std::string>>& items) {
  std::string s = "{";
  for (size_t i = 0; i < items.size(); ++i)
    s += fmt::format("{}'{}': '{}'", i ? ", " : "", items[i].first, items[i].second);
  return s + "}";
}

// DeepSpeed's print_model_aggregated_profile.
std::string aggregated(const ModuleTree& tree, int64_t module_depth, int64_t top_modules) {
  struct Sums {
    std::string type;
    double macs = 0, params = 0, duration = 0;
  };
  std::vector<std::vector<Sums>> info;  // per depth, per class in first-seen order
  // Depth first in child order, as walk_module recurses.
  std::vector<std::pair<int, size_t>> stack = {{0, 0}};
  while (!stack.empty()) {
    auto [n, depth] = stack.back();
    stack.pop_back();
    if (info.size() <= depth) info.resize(depth + 1);
    auto& level = info[depth];
    const ModuleNode& node = tree.node(n);
    auto it = std::find_if(level.begin(), level.end(),
                           [&](const Sums& s) { return s.type == node.type; });
    if (it == level.end()) it = level.insert(level.end(), Sums{node.type});
    it->macs += static_cast<double>(tree.macs(n));
    it->params += static_cast<double>(node.params);
    it->duration += tree.duration(n);
    for (auto c = node.children.rbegin(); c != node.children.rend(); ++c)
      stack.push_back({*c, depth + 1});
  }
  std::string out = fmt::format(
      "Top {} modules in terms of params, MACs or fwd latency at different model depths:\n",
      top_modules);
  const int64_t depth = module_depth == -1 ? static_cast<int64_t>(info.size()) - 1 : module_depth;
  for (int64_t d = 0; d < depth && d < static_cast<int64_t>(info.size()); ++d) {
    const auto& level = info[static_cast<size_t>(d)];
    const size_t count = static_cast<size_t>(
        std::max<int64_t>(0, std::min<int64_t>(top_modules, static_cast<int64_t>(level.size()))));
    auto top = [&](double Sums::*field, std::string (*to_string)(double)) {
      std::vector<Sums> sorted = level;
      std::stable_sort(sorted.begin(), sorted.end(),
                       [&](const Sums& a, const Sums& b) { return a.*field > b.*field; });
      std::vector<std::pair<std::string, std::string>> items;
      for (size_t i = 0; i < count; ++i)
        items.emplace_back(sorted[i].type, to_string(sorted[i].*field));
      return py_dict(items);
    };
    out += fmt::format("depth {}:\n", d);
    out += "    params      - " + top(&Sums::params, params_to_string) + "\n";
    out += "    MACs        - " + top(&Sums::macs, macs_to_string) + "\n";
    out += "    fwd latency - " + top(&Sums::duration, duration_to_string) + "\n";
  }
  return out;
}

}  // namespace

std::string number_to_string(double num) {
  double magnitude = 1;
  const char* units = "";
  if (num >= 1e12) {
    magnitude = 1e12, units = "T";
  } else if (num >= 1e9) {
    magnitude = 1e9, units = "G";
  } else if (num >= 1e6) {
    magnitude = 1e6, units = "M";
  } else if (num >= 1e3) {
    magnitude = 1e3, units = "K";
  } else if (num >= 1 || num == 0) {
    magnitude = 1, units = "";
  } else if (num >= 1e-3) {
    magnitude = 1e-3, units = "m";
  } else {
    magnitude = 1e-6, units = "u";
  }
  return py_g(py_round(num / magnitude)) + " " + units;
}

std::string macs_to_string(double macs) {
  return number_to_string(macs) + "MACs";
}
std::string flops_to_string(double flops) {
  return number_to_string(flops) + "FLOPS";
}
std::string duration_to_string(double seconds) {
  return number_to_string(seconds) + "s";
}

std::string params_to_string(double params) {
  std::string s = number_to_string(params);
  std::replace(s.begin(), s.end(), 'G', 'B');
  const size_t last = s.find_last_not_of(' ');
  return last == std::string::npos ? "" : s.substr(0, last + 1);
}

std::string model_profile_report(const ModuleTree& tree, const ReportOptions& options,
                                 const std::optional<EngineSummary>& engine) {
  const double params = static_cast<double>(tree.node(0).params);
  const double macs = static_cast<double>(tree.macs(0));
  const double flops = static_cast<double>(tree.flops(0));
  const double duration = tree.duration(0);
  const int64_t mp = engine ? engine->mp_size : 1;

  std::string out =
      "\n-------------------------- DeepSpeed Flops Profiler --------------------------\n";
  out += fmt::format("Profile Summary at step {}:\n", options.profile_step);
  out +=
      "Notations:\n"
      "data parallel size (dp_size), model parallel size(mp_size),\n"
      "number of parameters (params), number of multiply-accumulate operations(MACs),\n"
      "number of floating-point operations (flops), floating-point operations per second "
      "(FLOPS),\n"
      "fwd latency (forward propagation latency), bwd latency (backward propagation latency),\n"
      "step (weights update latency), iter latency (sum of fwd, bwd and step latency)\n\n";
  if (engine) {
    out += line("world size: ", std::to_string(engine->world_size));
    out += line("data parallel size: ", std::to_string(engine->dp_size));
    out += line("model parallel size: ", std::to_string(engine->mp_size));
    out += line("batch size per GPU: ", std::to_string(engine->micro_batch_per_gpu));
  }
  out += line("params per GPU: ", params_to_string(params));
  out += line("params of model = params per GPU * mp_size: ",
              params_to_string(engine ? params * static_cast<double>(mp) : 0));
  out += line("fwd MACs per GPU: ", macs_to_string(macs));
  out += line("fwd flops per GPU: ", number_to_string(flops));
  out += line("fwd flops of model = fwd flops per GPU * mp_size: ",
              number_to_string(flops * static_cast<double>(mp)));
  const double fwd = engine ? engine->fwd_latency : duration;
  auto rate = [](double f, double seconds) {
    return flops_to_string(seconds > 0 ? f / seconds : 0);
  };
  out += line("fwd latency: ", duration_to_string(fwd));
  out += line("fwd FLOPS per GPU = fwd flops per GPU / fwd latency: ", rate(flops, fwd));
  if (engine) {
    const double factor = 2 + engine->recompute_fwd_factor;
    const double bwd = engine->bwd_latency, step = engine->step_latency;
    out += line("bwd latency: ", duration_to_string(bwd));
    out += line(
        fmt::format("bwd FLOPS per GPU = {} * fwd flops per GPU / bwd latency: ", py_g(factor)),
        rate(factor * flops, bwd));
    out += line(fmt::format("fwd+bwd FLOPS per GPU = {} * fwd flops per GPU / (fwd+bwd latency): ",
                            py_g(factor + 1)),
                rate((factor + 1) * flops, fwd + bwd));
    out += line("step latency: ", duration_to_string(step));
    const double iter = fwd + bwd + step;
    out += line("iter latency: ", duration_to_string(iter));
    out += line(
        fmt::format("FLOPS per GPU = {} * fwd flops per GPU / iter latency: ", py_g(factor + 1)),
        rate((factor + 1) * flops, iter));
    const double samples = static_cast<double>(engine->micro_batch_per_gpu * engine->world_size);
    out += line("samples/second: ", py_float(iter > 0 ? py_round(samples / iter) : 0));
  }

  out +=
      "\n----------------------------- Aggregated Profile per GPU -----------------------------\n";
  out += aggregated(tree, options.module_depth, options.top_modules);

  if (options.detailed) {
    out +=
        "\n------------------------------ Detailed Profile per GPU "
        "------------------------------\n";
    out +=
        "Each module profile is listed after its name in the following order: \n"
        "params, percentage of total params, MACs, percentage of total MACs, fwd latency, "
        "percentage of total fwd latency, fwd FLOPS\n";
    out +=
        "\nNote: 1. A module can have torch.nn.module or torch.nn.functional to compute logits "
        "(e.g. CrossEntropyLoss). They are not counted as submodules, thus not to be printed "
        "out. However they make up the difference between a parent's MACs (or latency) and the "
        "sum of its submodules'.\n"
        "2. Number of floating-point operations is a theoretical estimation, thus FLOPS computed "
        "using that could be larger than the maximum system throughput.\n"
        "3. The fwd latency listed in the top module's profile is directly captured at the "
        "module forward function in PyTorch, thus it's less than the fwd latency shown above "
        "which is captured in DeepSpeed.\n\n";
    out += repr(tree, 0, Totals{params, macs, duration}) + "\n";
  }
  out += "------------------------------------------------------------------------------\n";
  return out;
}

}  // namespace dscpp::profiler
