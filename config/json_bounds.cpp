// The bounds of json_bounds.h; the walk keeps its own stack so that a value nested far
// deeper than the bound (built by a program, not read from text) cannot overflow ours.
#include "dscpp/config/json_bounds.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "dscpp/config/config_error.h"

namespace dscpp::config {

using nlohmann::json;

size_t invalid_utf8_at(const std::string& text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // UTF-16 surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + len > n || s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k)
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
    i += len;
  }
  return std::string::npos;
}

std::pair<int, int> line_column_at(const std::string& text, size_t offset) {
  int line = 1, col = 1;
  for (size_t i = 0; i < offset && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return {line, col};
}

void check_json_bounds(const json& value, const std::string& source) {
  std::vector<std::pair<const json*, std::string>> stack = {{&value, ""}};
  std::vector<int> depth = {0};
  auto where = [&](const std::string& path) {
    return source.empty() ? path : path.empty() ? source : source + ": " + path;
  };
  auto check_text = [&](const std::string& s, const std::string& path, const char* what) {
    size_t bad = invalid_utf8_at(s);
    if (bad != std::string::npos)
      throw ConfigError(where(path), fmt::format("{} is not valid UTF-8 (byte {} of it, 0x{:02x})",
                                                 what, bad, static_cast<unsigned char>(s[bad])));
  };
  while (!stack.empty()) {
    auto [v, path] = stack.back();
    int d = depth.back();
    stack.pop_back();
    depth.pop_back();
    if (v->is_string()) check_text(v->get_ref<const std::string&>(), path, "the string");
    if (!v->is_structured()) continue;
    if (d + 1 > kMaxConfigDepth)
      throw ConfigError(where(path), fmt::format("nested more than {} deep", kMaxConfigDepth));
    if (v->is_object()) {
      for (const auto& [k, sub] : v->items()) {
        check_text(k, path, "a key here");  // before it goes into a path
        std::string p = path.empty() ? k : path + "." + k;
        stack.emplace_back(&sub, p);
        depth.push_back(d + 1);
      }
    } else {
      for (size_t i = 0; i < v->size(); ++i) {
        stack.emplace_back(&(*v)[i], fmt::format("{}[{}]", path, i));
        depth.push_back(d + 1);
      }
    }
  }
}

}  // namespace dscpp::config
