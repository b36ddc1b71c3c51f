// Config text to JSON: nlohmann's parser for strict JSON with comments (the common case,
// and duplicate keys are refused as DeepSpeed refuses them), then a small relaxed reader
// for the Hjson that real DeepSpeed configs contain. No Hjson library exists for C++ in
// Debian or PyPI, so the relaxed reader is ours; it builds nlohmann values directly.
#include "dscpp/config/json_text.h"

#include <fmt/format.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "dscpp/config/config_error.h"
#include "dscpp/config/json_bounds.h"
#include "dscpp/config/yaml_text.h"

namespace dscpp::config {
namespace {

using nlohmann::json;

std::pair<int, int> line_col(const std::string& text, size_t offset) {
  return line_column_at(text, offset);
}

// The message for a byte that is not UTF-8.
std::string not_utf8(unsigned char byte) {
  return fmt::format("byte 0x{:02x} is not valid UTF-8 (a config must be UTF-8 text)", byte);
}

class RelaxedReader {
 public:
  // `bad_utf8`: the offset of a byte that is not UTF-8 (npos: none), which the reader names
  // by the JSON path of the key or value that holds it when it reaches it.
  RelaxedReader(const std::string& text, const std::string& source,
                size_t bad_utf8 = std::string::npos)
      : s_(text), source_(source), bad_utf8_(bad_utf8) {}

  // Whether the error thrown was the bad byte, named where the reader found it.
  bool named_bad_utf8() const { return named_bad_utf8_; }

  json read() {
    skip_blank();
    if (pos_ >= s_.size()) fail("no configuration in it (the text is empty or only comments)");
    json root;
    if (pos_ < s_.size() && (s_[pos_] == '{' || s_[pos_] == '[')) {
      root = value();
    } else {
      root = members(/*braced=*/false);  // Hjson allows the root object's braces to be left out
    }
    skip_blank();
    if (pos_ < s_.size()) fail("unexpected text after the end of the configuration");
    return root;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    auto [line, col] = line_col(s_, pos_);
    throw ConfigError("", fmt::format("{}:{}:{}: cannot parse: {}", source_, line, col, what));
  }

  // A value's problem, named by its JSON path too ("train_batch_size: ..."), so that the
  // user learns which key it was without counting columns.
  [[noreturn]] void fail_value(const std::string& what) const {
    fail(path_.empty() ? what : path_ + ": " + what);
  }

  // Fails naming the path when the bad byte lies in [begin, end), the text of a key (of the
  // object at path_) or of the value at path_.
  void check_utf8(size_t begin, size_t end, bool key) {
    if (bad_utf8_ < begin || bad_utf8_ >= end) return;
    pos_ = bad_utf8_;
    named_bad_utf8_ = true;
    const std::string what = not_utf8(static_cast<unsigned char>(s_[bad_utf8_]));
    if (!key) fail_value(what);
    fail(path_.empty() ? "a key: " + what : fmt::format("a key in {}: {}", path_, what));
  }

  bool at(char c) const { return pos_ < s_.size() && s_[pos_] == c; }

  // Skips whitespace and comments; returns whether a newline was crossed, since Hjson
  // lets a newline stand in for a comma.
  bool skip_blank() {
    bool newline = false;
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == '\n') {
        newline = true;
        ++pos_;
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        ++pos_;
      } else if (c == '#' || (c == '/' && pos_ + 1 < s_.size() && s_[pos_ + 1] == '/')) {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else if (c == '/' && pos_ + 1 < s_.size() && s_[pos_ + 1] == '*') {
        size_t end = s_.find("*/", pos_ + 2);
        if (end == std::string::npos) fail("unterminated /* comment");
        newline = newline || s_.find('\n', pos_) < end;
        pos_ = end + 2;
      } else {
        break;
      }
    }
    return newline;
  }

  json members(bool braced) {
    json obj = json::object();
    std::set<std::string> seen;
    while (true) {
      skip_blank();
      if (braced && at('}')) {
        ++pos_;
        return obj;
      }
      if (pos_ >= s_.size()) {
        if (braced) fail("missing '}' at the end of an object" + swallowed_hint('}'));
        return obj;
      }
      size_t key_pos = pos_;
      std::string k = key();
      if (!seen.insert(k).second) {
        pos_ = key_pos;
        fail(fmt::format("duplicate key \"{}\"", k));
      }
      skip_blank();
      if (!at(':')) fail(fmt::format("expected ':' after key \"{}\"", k));
      ++pos_;
      const size_t outer = path_.size();
      path_ += path_.empty() ? k : "." + k;
      obj[k] = value();
      path_.resize(outer);
      bool newline = skip_blank();
      if (at(',')) {
        ++pos_;
      } else if (!(braced && at('}')) && pos_ < s_.size() && !newline) {
        fail("expected ',' or a new line between members");
      }
    }
  }

  json elements() {
    json arr = json::array();
    while (true) {
      skip_blank();
      if (at(']')) {
        ++pos_;
        return arr;
      }
      if (pos_ >= s_.size()) fail("missing ']' at the end of an array" + swallowed_hint(']'));
      const size_t outer = path_.size();
      path_ += fmt::format("[{}]", arr.size());
      arr.push_back(value());
      path_.resize(outer);
      bool newline = skip_blank();
      if (at(',')) {
        ++pos_;
      } else if (!at(']') && !newline) {
        fail("expected ',' or a new line between array elements");
      }
    }
  }

  std::string key() {
    if (at('"') || at('\'')) return quoted(/*is_key=*/true);
    size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] != ':' &&
           !std::isspace(static_cast<unsigned char>(s_[pos_])) && s_[pos_] != '{' &&
           s_[pos_] != '}' && s_[pos_] != '[' && s_[pos_] != ']' && s_[pos_] != ',')
      ++pos_;
    if (pos_ == start) fail("expected a key");
    check_utf8(start, pos_, /*key=*/true);
    return s_.substr(start, pos_ - start);
  }

  std::string quoted(bool is_key = false) {
    char q = s_[pos_];
    size_t start = pos_;
    ++pos_;
    std::string raw;
    while (pos_ < s_.size() && s_[pos_] != q) {
      if (s_[pos_] == '\n') fail("unterminated string");
      if (s_[pos_] == '\\' && pos_ + 1 < s_.size()) raw += s_[pos_++];
      raw += s_[pos_++];
    }
    if (pos_ >= s_.size()) {
      pos_ = start;
      fail("unterminated string");
    }
    ++pos_;
    check_utf8(start, pos_, is_key);
    if (q == '\'') {  // re-quote for nlohmann: escape bare double quotes
      std::string out;
      for (size_t i = 0; i < raw.size(); ++i) {
        if (raw[i] == '\\' && i + 1 < raw.size() && raw[i + 1] == '\'') {
          out += '\'';
          ++i;
        } else if (raw[i] == '"') {
          out += "\\\"";
        } else {
          out += raw[i];
        }
      }
      raw = out;
    }
    try {
      return json::parse("\"" + raw + "\"").get<std::string>();
    } catch (const json::exception&) {
      pos_ = start;
      fail("invalid escape in string");
    }
  }

  // Hjson's quoteless values run to the end of the line, so `{"a": x}` on one line reads
  // the '}' into the string; when the text then ends short of a bracket, say so.
  std::string swallowed_hint(char bracket) const {
    for (auto it = quoteless_.rbegin(); it != quoteless_.rend(); ++it) {
      if (it->second.find(bracket) == std::string::npos) continue;
      auto [line, col] = line_col(s_, it->first);
      return fmt::format(
          " (the quoteless value at {}:{} runs to the end of its line, '{}' included, as in "
          "Hjson: quote it if it is a string, or fix it if it was meant as a number)",
          line, col, bracket);
    }
    return "";
  }

  // Nesting is bounded before anything recursive (this reader, nlohmann's copy and dump)
  // can run out of stack.
  json nested(bool object) {
    if (++depth_ > kMaxConfigDepth) fail(fmt::format("nested more than {} deep", kMaxConfigDepth));
    ++pos_;
    json v = object ? members(true) : elements();
    --depth_;
    return v;
  }

  json value() {
    skip_blank();
    if (pos_ >= s_.size()) fail("expected a value");
    char c = s_[pos_];
    if (c == '{' || c == '[') return nested(c == '{');
    if (c == '"' || c == '\'') return quoted();
    if (c == '}' || c == ']' || c == ',' || c == ':') fail(fmt::format("unexpected '{}'", c));
    // Hjson: a quoteless value runs to the end of the line, unless it is a literal
    // (number, true, false, null) followed only by a comma or a comment.
    size_t eol = s_.find('\n', pos_);
    if (eol == std::string::npos) eol = s_.size();
    size_t tok_end = pos_;
    while (tok_end < eol && !std::isspace(static_cast<unsigned char>(s_[tok_end])) &&
           s_[tok_end] != ',' && s_[tok_end] != '}' && s_[tok_end] != ']' && s_[tok_end] != '#' &&
           !(s_[tok_end] == '/' && tok_end + 1 < eol &&
             (s_[tok_end + 1] == '/' || s_[tok_end + 1] == '*')))
      ++tok_end;
    std::string tok = s_.substr(pos_, tok_end - pos_);
    std::string word = lower(tok[0] == '-' || tok[0] == '+' ? tok.substr(1) : tok);
    if (word == "nan" || word == "inf" || word == "infinity")
      fail_value(fmt::format("{} is not a JSON number: write a finite number", tok));
    json literal;
    try {
      literal = json::parse(tok, nullptr, /*allow_exceptions=*/true);
    } catch (const json::out_of_range&) {
      fail_value(fmt::format("{} is out of range (a number beyond a double's 1.8e308)", tok));
    } catch (const json::exception&) {
      literal = json(json::value_t::discarded);
    }
    if (!literal.is_discarded() && !literal.is_string() && !literal.is_structured()) {
      pos_ = tok_end;
      return literal;
    }
    std::string rest = s_.substr(pos_, eol - pos_);
    while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.back()))) rest.pop_back();
    check_utf8(pos_, eol, /*key=*/false);
    quoteless_.emplace_back(pos_, rest);
    pos_ = eol;
    return rest;
  }

  static std::string lower(std::string w) {
    for (char& ch : w) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return w;
  }

  const std::string& s_;
  const std::string& source_;
  const size_t bad_utf8_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::string path_;  // the JSON path of the value being read ("a.b[2]"); "" at the root
  bool named_bad_utf8_ = false;
  std::vector<std::pair<size_t, std::string>> quoteless_;  // offset, value: for error hints
};

// Thrown by the strict parser's callback to hand a too-deep text to the relaxed reader,
// which names the line and column.
struct TooDeep {};

// nlohmann keeps the last of two equal keys; DeepSpeed refuses them, and so do we.
json parse_strict(const std::string& text) {
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth >= kMaxConfigDepth) throw TooDeep{};
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end) keys.pop_back();
    if (event == json::parse_event_t::key &&
        !keys.back().insert(parsed.get<std::string>()).second && duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  json j = json::parse(text, cb, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  if (!duplicate.empty()) throw ConfigError("", fmt::format("duplicate key \"{}\"", duplicate));
  return j;
}

}  // namespace

json parse_config_text(const std::string& text, const std::string& source) {
  if (text.size() > kMaxConfigBytes)
    throw ConfigError("", fmt::format("{}: {} bytes is more than a config may hold ({} MiB)",
                                      source, text.size(), kMaxConfigBytes >> 20));
  if (size_t bad = invalid_utf8_at(text); bad != std::string::npos) {
    // The reader names the key or value that holds the byte when it gets that far; a byte
    // in a comment, or past another error, is named by its line and column alone.
    RelaxedReader reader(text, source, bad);
    try {
      reader.read();
    } catch (const ConfigError& e) {
      if (reader.named_bad_utf8()) throw;
    } catch (const json::exception&) {
    }
    auto [line, col] = line_col(text, bad);
    throw ConfigError("", fmt::format("{}:{}:{}: cannot parse: {}", source, line, col,
                                      not_utf8(static_cast<unsigned char>(text[bad]))));
  }
  try {
    return parse_strict(text);
  } catch (const json::exception&) {
    // Not strict JSON (or a number beyond a double, or too deep): the relaxed reader either
    // reads it or names the line and column.
  } catch (const TooDeep&) {
  } catch (const ConfigError& e) {
    throw ConfigError("", source + ": " + e.what());
  }
  try {
    return RelaxedReader(text, source).read();
  } catch (const json::exception& e) {  // nothing of nlohmann's may escape as itself
    throw ConfigError("", fmt::format("{}: cannot parse: {}", source, e.what()));
  }
}

json read_config(const std::string& path_or_text) {
  size_t first = path_or_text.find_first_not_of(" \t\r\n");
  bool is_text = first != std::string::npos && path_or_text[first] == '{';
  return is_text ? parse_config_text(path_or_text, "<config text>")
                 : read_config_file(path_or_text);
}

json read_config_file(const std::string& path, KeyPositions* positions) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec))
    throw ConfigError("", fmt::format("'{}' is a folder, not a config file", path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("", fmt::format("cannot open config file '{}'", path));
  // Read at most one byte past the bound, so that a pipe or /dev/zero cannot fill memory.
  std::string text(kMaxConfigBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (in.bad()) throw ConfigError("", fmt::format("cannot read config file '{}'", path));
  if (is_yaml_path(path)) return parse_yaml_text(text, path, positions);
  return parse_config_text(text, path);
}

std::string where_in_file(const std::string& file, const KeyPositions& positions,
                          const std::string& path) {
  // Walk up the path ("model.ffn[1]" -> "model.ffn" -> "model") to the nearest key we placed.
  std::string p = path;
  while (!p.empty()) {
    auto it = positions.find(p);
    if (it != positions.end())
      return fmt::format("{}:{}:{}", file, it->second.line, it->second.column);
    size_t cut = p.find_last_of(".[");
    if (cut == std::string::npos) break;
    p.resize(cut);
  }
  return file;
}

}  // namespace dscpp::config
