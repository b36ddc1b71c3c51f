// Section: typed getters over one JSON object of a ds_config.
#include "dscpp/config/section.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>

#include "dscpp/config/config_error.h"

namespace dscpp::config {

using nlohmann::json;

bool is_auto(const json& v) {
  return v.is_string() && v.get<std::string>() == "auto";
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string range_text(int64_t min, int64_t max) {
  if (min != Section::kMinInt && max != Section::kMaxInt)
    return fmt::format(" in [{}, {}]", min, max);
  if (min != Section::kMinInt) return fmt::format(" >= {}", min);
  if (max != Section::kMaxInt) return fmt::format(" <= {}", max);
  return "";
}

}  // namespace

std::string show_value(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

std::string closest_key(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::string::npos;
  for (const auto& c : candidates) {
    size_t d = edit_distance(lower(word), lower(c));
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  // Close enough to be a typo: a few edits, relative to the key's length.
  size_t limit = std::max<size_t>(2, std::min(word.size(), best.size()) / 4);
  return best_d <= limit ? best : "";
}

Section::Section(const json* obj, std::string path, Diagnostics* diag)
    : obj_(obj), path_(std::move(path)), diag_(diag) {}

std::string Section::path_of(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

void Section::fail(const std::string& key, const std::string& expected) const {
  const json* v = obj_ && obj_->contains(key) ? &(*obj_)[key] : nullptr;
  throw ConfigError(path_of(key), fmt::format("expected {}, found {}", expected,
                                              v ? show_value(*v) : std::string("nothing")));
}

void Section::note(const std::string& key) {
  known_.insert(key);
  if (diag_) diag_->resolved.insert(path_of(key));
}

const json* Section::find(const std::string& key) {
  note(key);
  if (!obj_) return nullptr;
  auto it = obj_->find(key);
  if (it == obj_->end() || is_auto(*it)) return nullptr;
  return &*it;
}

bool Section::has(const std::string& key) const {
  return obj_ && obj_->contains(key) && !is_auto((*obj_)[key]);
}

const json* Section::raw(const std::string& key) {
  note(key);
  if (!obj_) return nullptr;
  auto it = obj_->find(key);
  return it == obj_->end() ? nullptr : &*it;
}

bool Section::get_bool(const std::string& key, bool def) {
  const json* v = find(key);
  if (!v) return def;
  if (v->is_boolean()) return v->get<bool>();
  // DeepSpeed's pydantic models take 0 and 1 for booleans; real configs use them.
  if (v->is_number_integer() && (v->get<int64_t>() == 0 || v->get<int64_t>() == 1))
    return v->get<int64_t>() == 1;
  fail(key, "true or false");
}

int64_t Section::get_int(const std::string& key, int64_t def, int64_t min, int64_t max) {
  auto v = get_opt_int(key, min, max);
  return v ? *v : def;
}

std::optional<int64_t> Section::get_opt_int(const std::string& key, int64_t min, int64_t max) {
  const json* v = find(key);
  if (!v || v->is_null()) return std::nullopt;
  std::string expected = "an integer" + range_text(min, max);
  int64_t out = 0;
  if (v->is_number_integer()) {
    out = v->get<int64_t>();
  } else if (v->is_number_float()) {
    // Sizes are written as 5e8 in most real configs: accept floats with no fraction.
    double d = v->get<double>();
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.2e18) fail(key, expected);
    out = static_cast<int64_t>(d);
  } else {
    fail(key, expected);
  }
  if (out < min || out > max) fail(key, expected);
  return out;
}

double Section::get_double(const std::string& key, double def, double min, double max) {
  const json* v = find(key);
  if (!v) return def;
  double d = v->is_number() ? v->get<double>() : std::nan("");
  if (!std::isfinite(d) || d < min || d > max) {
    std::string range;
    if (std::isfinite(min) && std::isfinite(max))
      range = fmt::format(" in [{}, {}]", min, max);
    else if (std::isfinite(min))
      range = fmt::format(" >= {}", min);
    else if (std::isfinite(max))
      range = fmt::format(" <= {}", max);
    fail(key, "a finite number" + range);
  }
  return d;
}

std::string Section::get_string(const std::string& key, const std::string& def) {
  auto v = get_opt_string(key);
  return v ? *v : def;
}

std::optional<std::string> Section::get_opt_string(const std::string& key) {
  const json* v = find(key);
  if (!v || v->is_null()) return std::nullopt;
  if (!v->is_string()) fail(key, "a string");
  return v->get<std::string>();
}

std::string Section::get_choice(const std::string& key, const std::string& def,
                                const std::vector<std::string>& choices) {
  auto v = get_opt_string(key);
  if (!v) {
    if (raw(key) && !raw(key)->is_null() && !is_auto(*raw(key))) fail(key, "a string");
    return def;
  }
  for (const auto& c : choices)
    if (lower(c) == lower(*v)) return c;
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "\"" : ", \"") + c + "\"";
  fail(key, "one of " + list);
}

Section Section::sub(const std::string& key) {
  note(key);
  if (!obj_ || !obj_->contains(key)) return Section(nullptr, path_of(key), diag_);
  const json& v = (*obj_)[key];
  if (v.is_null() || is_auto(v)) return Section(nullptr, path_of(key), diag_);
  if (!v.is_object()) fail(key, "an object");
  return Section(&v, path_of(key), diag_);
}

void Section::known(std::initializer_list<const char*> keys) {
  for (const char* k : keys) note(k);
}

void Section::finish() {
  if (!obj_) return;
  std::vector<std::string> candidates(known_.begin(), known_.end());
  for (const auto& [key, value] : obj_->items()) {
    if (known_.count(key)) continue;
    std::string hint = closest_key(key, candidates);
    std::string did_you_mean =
        hint.empty() ? "" : fmt::format(" (did you mean '{}'?)", path_of(hint));
    if (diag_->strict) throw ConfigError(path_of(key), "unknown key" + did_you_mean);
    diag_->warnings.push_back(
        fmt::format("unknown key '{}'{}: ignored", path_of(key), did_you_mean));
  }
}

}  // namespace dscpp::config
