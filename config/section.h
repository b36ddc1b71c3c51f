// Typed, path-aware access to one JSON object of a ds_config. Every getter records the key
// as known, checks the type and range, and throws ConfigError naming the JSON path, what
// was expected and what was found. `"auto"` inside a section means the default, as in
// DeepSpeed. finish() reports the keys nobody asked for (a warning with the closest known
// key, or an error in strict mode).
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace dscpp::config {

// What reading a config had to say, besides errors.
struct Diagnostics {
  std::vector<std::string> warnings;  // unknown keys, deprecated keys, odd values we accept
  std::vector<std::string> ignored;   // DeepSpeed features dscpp reads but does not implement
  bool strict = false;                // unknown keys are errors instead of warnings
  // Every key path a getter, raw(), sub() or known() asked about, present or not: what the
  // key-fate table (key_fates.h) must cover.
  std::set<std::string> resolved;
};

class Section {
 public:
  static constexpr int64_t kMinInt = std::numeric_limits<int64_t>::min();
  static constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

  // `obj` may be null (a missing section: every getter returns its default).
  Section(const nlohmann::json* obj, std::string path, Diagnostics* diag);

  bool present() const { return obj_ != nullptr; }
  // Present with a value other than "auto".
  bool has(const std::string& key) const;
  std::string path_of(const std::string& key) const;

  bool get_bool(const std::string& key, bool def);
  int64_t get_int(const std::string& key, int64_t def, int64_t min = kMinInt,
                  int64_t max = kMaxInt);
  std::optional<int64_t> get_opt_int(const std::string& key, int64_t min = kMinInt,
                                     int64_t max = kMaxInt);
  double get_double(const std::string& key, double def,
                    double min = -std::numeric_limits<double>::infinity(),
                    double max = std::numeric_limits<double>::infinity());
  std::string get_string(const std::string& key, const std::string& def);
  std::optional<std::string> get_opt_string(const std::string& key);
  // A string from a fixed set, compared case-insensitively; returns the canonical spelling.
  std::string get_choice(const std::string& key, const std::string& def,
                         const std::vector<std::string>& choices);
  // The raw value (null if absent), marked as known.
  const nlohmann::json* raw(const std::string& key);
  // A nested object; absent gives an empty section, a non-object is an error.
  Section sub(const std::string& key);
  // Keys DeepSpeed reads that we accept without typing them here.
  void known(std::initializer_list<const char*> keys);
  // Warns (or fails, when strict) about every key of this object nobody asked for.
  void finish();

  [[noreturn]] void fail(const std::string& key, const std::string& expected) const;

 private:
  void note(const std::string& key);  // known here, and resolved for the key-fate table
  const nlohmann::json* find(const std::string& key);

  const nlohmann::json* obj_;
  std::string path_;
  Diagnostics* diag_;
  std::set<std::string> known_;
};

// The closest of `candidates` to `word` (edit distance), or "" when none is close.
std::string closest_key(const std::string& word, const std::vector<std::string>& candidates);

// A JSON value shown in an error message: short, one line.
std::string show_value(const nlohmann::json& v);

// The string "auto" (DeepSpeed's placeholder).
bool is_auto(const nlohmann::json& v);
// ASCII lower case, for DeepSpeed's case-insensitive names.
std::string lower(std::string s);

}  // namespace dscpp::config
