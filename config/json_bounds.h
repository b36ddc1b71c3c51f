// Bounds on outside input, shared by every reader of JSON we are given (ds_config, model
// config): how large a text may be, how deep values may nest, and that every string is
// valid UTF-8. Deep nesting would overflow the stack of any recursive walk (a parser, a copy,
// dump()); invalid UTF-8 makes nlohmann's dump() throw and Python's torch.load refuse the
// checkpoints that record the config. Each check throws ConfigError naming where.
#pragma once

#include <cstddef>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>

namespace dscpp::config {

inline constexpr size_t kMaxConfigBytes = 16u << 20;  // real configs are a few KiB
inline constexpr int kMaxConfigDepth = 100;           // real configs nest under 10 deep

// The offset of the first byte that is not part of well-formed UTF-8 (no overlong forms,
// no surrogates, nothing above U+10FFFF), or std::string::npos when all of it is.
size_t invalid_utf8_at(const std::string& text);

// The 1-based line and column of byte `offset` of `text`, for errors that name a position.
std::pair<int, int> line_column_at(const std::string& text, size_t offset);

// Walks `value` without recursion: nesting deeper than kMaxConfigDepth or a key or string
// that is not UTF-8 is a ConfigError naming the JSON path and `source`.
void check_json_bounds(const nlohmann::json& value, const std::string& source);

}  // namespace dscpp::config
