// YAML text to JSON through yaml-cpp. yaml-cpp keeps every scalar as text and leaves typing
// to the caller, so the core-schema resolution of plain scalars is here; it also accepts a
// key twice (the later silently wins), which a config must not, so duplicates are caught here.
#include "dscpp/config/yaml_text.h"

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "dscpp/config/config_error.h"
#include "dscpp/config/json_bounds.h"

namespace dscpp::config {
namespace {

using nlohmann::json;

// Aliases share one node in yaml-cpp but expand when copied into JSON: a few lines of nested
// aliases ("billion laughs") would expand into billions of values. Real configs hold hundreds.
constexpr size_t kMaxYamlValues = 1u << 16;

const std::string kTagPrefix = "tag:yaml.org,2002:";

class Converter {
 public:
  Converter(std::string source, KeyPositions* positions)
      : source_(std::move(source)), positions_(positions) {}

  json convert(const YAML::Node& node, const std::string& path, int depth) {
    if (++values_ > kMaxYamlValues)
      fail(node.Mark(),
           fmt::format("more than {} values (aliases expanding without bound?)", kMaxYamlValues));
    if (depth > kMaxConfigDepth)
      fail(node.Mark(), fmt::format("nested more than {} deep", kMaxConfigDepth));
    switch (node.Type()) {
      case YAML::NodeType::Undefined:
      case YAML::NodeType::Null:
        return nullptr;
      case YAML::NodeType::Scalar:
        return scalar(node);
      case YAML::NodeType::Sequence: {
        json a = json::array();
        size_t i = 0;
        for (const auto& item : node)
          a.push_back(convert(item, fmt::format("{}[{}]", path, i++), depth + 1));
        return a;
      }
      case YAML::NodeType::Map: {
        json o = json::object();
        for (const auto& kv : node) {
          const YAML::Node& key = kv.first;
          if (!key.IsScalar())
            fail(key.Mark(), "a key must be a plain name, not a list or a mapping");
          const std::string& name = key.Scalar();
          if (o.contains(name)) fail(key.Mark(), fmt::format("duplicate key \"{}\"", name));
          const std::string child = path.empty() ? name : path + "." + name;
          if (positions_) (*positions_)[child] = {key.Mark().line + 1, key.Mark().column + 1};
          o[name] = convert(kv.second, child, depth + 1);
        }
        return o;
      }
    }
    return nullptr;
  }

  [[noreturn]] void fail(const YAML::Mark& mark, const std::string& what) const {
    if (mark.is_null()) throw ConfigError("", fmt::format("{}: cannot parse: {}", source_, what));
    throw ConfigError("", fmt::format("{}:{}:{}: cannot parse: {}", source_, mark.line + 1,
                                      mark.column + 1, what));
  }

 private:
  json scalar(const YAML::Node& node) const {
    const std::string& text = node.Scalar();
    const std::string& tag = node.Tag();
    if (tag == "!") return text;  // quoted: a string whatever it spells
    if (tag == "?" || tag.empty()) return plain(text);
    if (tag.rfind(kTagPrefix, 0) != 0)
      fail(node.Mark(), fmt::format("tag '{}' is not one a config can use", tag));
    const std::string kind = tag.substr(kTagPrefix.size());
    if (kind == "str") return text;
    json typed = plain(text);
    const bool ok = (kind == "int" && typed.is_number_integer()) ||
                    (kind == "float" && typed.is_number()) ||
                    (kind == "bool" && typed.is_boolean()) || (kind == "null" && typed.is_null());
    if (!ok) fail(node.Mark(), fmt::format("'{}' is not a valid !!{}", text, kind));
    if (kind == "float") return typed.get<double>();
    return typed;
  }

  // YAML 1.2's core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution).
  static json plain(const std::string& s) {
    static const std::set<std::string> nulls = {"", "~", "null", "Null", "NULL"};
    static const std::set<std::string> trues = {"true", "True", "TRUE"};
    static const std::set<std::string> falses = {"false", "False", "FALSE"};
    if (nulls.count(s)) return nullptr;
    if (trues.count(s)) return true;
    if (falses.count(s)) return false;
    // Only text that starts as a number can be one: the regular expressions (slow in a debug
    // build) see no names.
    const char c0 = s[0];
    if (!(std::isdigit(static_cast<unsigned char>(c0)) || c0 == '-' || c0 == '+' || c0 == '.'))
      return s;
    static const std::regex dec("[-+]?[0-9]+");
    static const std::regex oct("0o[0-7]+");
    static const std::regex hex("0x[0-9a-fA-F]+");
    static const std::regex flt("[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?");
    static const std::regex inf("[-+]?\\.(inf|Inf|INF)");
    static const std::regex nan("\\.(nan|NaN|NAN)");
    // Beyond int64: a decimal becomes a double (as nlohmann reads it); a hexadecimal or octal
    // number stays text, which the typed readers refuse by type.
    try {
      if (std::regex_match(s, dec)) return std::stoll(s);
      if (std::regex_match(s, oct)) return std::stoll(s.substr(2), nullptr, 8);
      if (std::regex_match(s, hex)) return std::stoll(s.substr(2), nullptr, 16);
    } catch (const std::out_of_range&) {
      return std::regex_match(s, dec) ? json(std::stod(s)) : json(s);
    }
    if (std::regex_match(s, flt)) return std::stod(s);
    // JSON has no infinity or NaN: kept as doubles, the typed readers refuse them by range.
    if (std::regex_match(s, inf))
      return s[0] == '-' ? -std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::infinity();
    if (std::regex_match(s, nan)) return std::numeric_limits<double>::quiet_NaN();
    return s;
  }

  std::string source_;
  KeyPositions* positions_;
  size_t values_ = 0;
};

}  // namespace

bool is_yaml_path(const std::string& path) {
  const size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || path.find('/', dot) != std::string::npos) return false;
  std::string ext = path.substr(dot + 1);
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == "yaml" || ext == "yml";
}

json parse_yaml_text(const std::string& text, const std::string& source, KeyPositions* positions) {
  if (text.size() > kMaxConfigBytes)
    throw ConfigError("", fmt::format("{}: {} bytes is more than a config may hold ({} MiB)",
                                      source, text.size(), kMaxConfigBytes >> 20));
  if (size_t bad = invalid_utf8_at(text); bad != std::string::npos)
    throw ConfigError("", fmt::format("{}: cannot parse: byte 0x{:02x} at offset {} is not valid "
                                      "UTF-8 (a config must be UTF-8 text)",
                                      source, static_cast<unsigned char>(text[bad]), bad));
  Converter converter(source, positions);
  std::vector<YAML::Node> docs;
  try {
    docs = YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    converter.fail(e.mark, e.msg);
  }
  if (docs.empty() || docs[0].IsNull())
    throw ConfigError("", source + ": no configuration in it (the text is empty or only comments)");
  if (docs.size() > 1)
    converter.fail(docs[1].Mark(), "a second YAML document ('---'): a config is one document");
  try {
    return converter.convert(docs[0], "", 0);
  } catch (const YAML::Exception& e) {
    converter.fail(e.mark, e.msg);
  }
}

}  // namespace dscpp::config
