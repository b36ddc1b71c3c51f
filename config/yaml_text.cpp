// YAML text to JSON through yaml-cpp. yaml-cpp keeps every scalar as text and leaves typing
// to the caller, so the core-schema resolution of plain scalars is here; it also accepts a
// key twice (the later silently wins), which a config must not, so duplicates are caught here.
#include "dscpp/config/yaml_text.h"

#include <fmt/format.h>
#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "dscpp/config/config_error.h"
#include "dscpp/config/json_bounds.h"

namespace dscpp::config {
namespace {

using nlohmann::json;

// Aliases share one node in yaml-cpp but expand when copied into JSON: a few lines of nested
// aliases ("billion laughs") would expand into billions of values. Real configs hold hundreds.
constexpr size_t kMaxYamlValues = 1u << 16;

const std::string kTagPrefix = "tag:yaml.org,2002:";

// Where each document of the text starts (yaml-cpp's event interface, nothing else kept).
struct DocumentStarts : YAML::EventHandler {
  std::vector<YAML::Mark> marks;
  void OnDocumentStart(const YAML::Mark& mark) override { marks.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t,
                const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

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
        return scalar(node, path);
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
  // `path` (the value's JSON path) prefixes what is wrong with the value, so that the user
  // learns which key it was.
  json scalar(const YAML::Node& node, const std::string& path) const {
    auto fail_value = [&](const std::string& what) {
      fail(node.Mark(), path.empty() ? what : path + ": " + what);
    };
    const std::string& text = node.Scalar();
    const std::string& tag = node.Tag();
    if (tag == "!") return text;  // quoted: a string whatever it spells
    json typed;
    if (tag == "?" || tag.empty()) {
      typed = plain(text);
    } else {
      if (tag.rfind(kTagPrefix, 0) != 0)
        fail_value(fmt::format("tag '{}' is not one a config can use", tag));
      const std::string kind = tag.substr(kTagPrefix.size());
      if (kind == "str") return text;
      typed = plain(text);
      const bool ok = (kind == "int" && typed.is_number_integer()) ||
                      (kind == "float" && typed.is_number()) ||
                      (kind == "bool" && typed.is_boolean()) || (kind == "null" && typed.is_null());
      if (!ok) fail_value(fmt::format("'{}' is not a valid !!{}", text, kind));
      if (kind == "float") typed = typed.get<double>();
    }
    // JSON has no infinity or NaN, and no config value means one.
    if (typed.is_number_float() && !std::isfinite(typed.get<double>()))
      fail_value(fmt::format("'{}' is not a finite number", text));
    return typed;
  }

  // YAML 1.2's core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution), matched by
  // hand: std::regex recurses per character and would overflow the stack on a long number.
  static json plain(const std::string& s) {
    static const std::set<std::string> nulls = {"", "~", "null", "Null", "NULL"};
    static const std::set<std::string> trues = {"true", "True", "TRUE"};
    static const std::set<std::string> falses = {"false", "False", "FALSE"};
    static const std::set<std::string> infs = {".inf",  ".Inf",  ".INF",  "+.inf", "+.Inf",
                                               "+.INF", "-.inf", "-.Inf", "-.INF"};
    static const std::set<std::string> nans = {".nan", ".NaN", ".NAN"};
    if (nulls.count(s)) return nullptr;
    if (trues.count(s)) return true;
    if (falses.count(s)) return false;
    if (infs.count(s))
      return s[0] == '-' ? -std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::infinity();
    if (nans.count(s)) return std::numeric_limits<double>::quiet_NaN();
    auto digits = [&](size_t i, int base) {  // the end of a run of digits from i
      auto value = [](char c) {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return 99;
      };
      while (i < s.size() && value(s[i]) < base) ++i;
      return i;
    };
    if (s.size() > 2 && s[0] == '0' && (s[1] == 'o' || s[1] == 'x')) {
      const int base = s[1] == 'o' ? 8 : 16;
      if (digits(2, base) != s.size()) return s;
      // Beyond int64 it stays text, which the typed readers refuse by type.
      errno = 0;
      const unsigned long long v = std::strtoull(s.c_str() + 2, nullptr, base);
      if (errno == ERANGE || v > static_cast<unsigned long long>(INT64_MAX)) return s;
      return static_cast<int64_t>(v);
    }
    size_t i = (s[0] == '-' || s[0] == '+') ? 1 : 0;
    const size_t int_start = i;
    i = digits(i, 10);
    const bool has_int = i > int_start;
    if (has_int && i == s.size()) {
      errno = 0;
      const long long v = std::strtoll(s.c_str(), nullptr, 10);
      // Beyond int64 a decimal becomes a double, as nlohmann reads it.
      if (errno == ERANGE) return std::strtod(s.c_str(), nullptr);
      return static_cast<int64_t>(v);
    }
    bool has_frac = false;
    if (i < s.size() && s[i] == '.') {
      const size_t frac_start = ++i;
      i = digits(i, 10);
      has_frac = i > frac_start;
    }
    if (!has_int && !has_frac) return s;
    if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
      ++i;
      if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
      const size_t exp_start = i;
      i = digits(i, 10);
      if (i == exp_start) return s;
    }
    if (i != s.size()) return s;
    // strtod, not stod: beyond a double is infinity (refused by the caller), not an exception.
    return std::strtod(s.c_str(), nullptr);
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
  if (size_t bad = invalid_utf8_at(text); bad != std::string::npos) {
    const auto [line, col] = line_column_at(text, bad);
    throw ConfigError("", fmt::format("{}:{}:{}: cannot parse: byte 0x{:02x} is not valid UTF-8 "
                                      "(a config must be UTF-8 text)",
                                      source, line, col, static_cast<unsigned char>(text[bad])));
  }
  // yaml-cpp guesses UTF-16 or UTF-32 from NUL bytes at the start and transcodes; a config
  // is UTF-8, in which a NUL byte is no character YAML allows.
  if (size_t nul = text.find('\0'); nul != std::string::npos)
    throw ConfigError("", fmt::format("{}: cannot parse: a NUL byte at offset {} (a config must "
                                      "be UTF-8 text)",
                                      source, nul));
  Converter converter(source, positions);
  // Not YAML::LoadAll: on some malformed text (a stray ',' where a node starts) yaml-cpp 0.7's
  // parser reports a new empty document forever without consuming the token, and LoadAll
  // loops, filling memory (jbeder/yaml-cpp#1040, fixed in 0.8.1 by #1319). Counting at most
  // two documents with the event parser is bounded; YAML::Load then reads the first.
  DocumentStarts starts;
  YAML::Node doc;
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    for (int i = 0; i < 2 && parser.HandleNextDocument(starts); ++i) {
    }
    doc = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    converter.fail(e.mark, e.msg);
  }
  if (starts.marks.size() > 1)
    converter.fail(starts.marks[1],
                   "text after the configuration: a second YAML document ('---'), or a stray "
                   "',' or other token where none may stand; a config is one document");
  if (doc.IsNull())
    throw ConfigError("", source + ": no configuration in it (the text is empty or only comments)");
  const std::vector<YAML::Node> docs = {doc};
  try {
    json result = converter.convert(docs[0], "", 0);
    // What yaml-cpp made of the text is checked as any JSON we are given (UTF-8 of every key
    // and string: its escapes can spell a lone surrogate).
    check_json_bounds(result, source);
    return result;
  } catch (const YAML::Exception& e) {
    converter.fail(e.mark, e.msg);
  }
}

}  // namespace dscpp::config
