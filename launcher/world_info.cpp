#include "world_info.h"

#include <fmt/format.h>

#include <cctype>

namespace dscpp::launcher {
namespace {

// Reads one UTF-8 sequence starting at text[i] and leaves i on its last byte. Invalid
// bytes are taken as Latin-1 so that encoding never fails.
unsigned decode_utf8(const std::string& text, size_t& i) {
  unsigned char c = static_cast<unsigned char>(text[i]);
  int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
  if (extra == 0 || i + extra >= text.size()) return c;
  unsigned code = c & (0x3F >> extra);
  for (int k = 1; k <= extra; ++k) {
    unsigned char d = static_cast<unsigned char>(text[i + k]);
    if ((d & 0xC0) != 0x80) return c;
    code = (code << 6) | (d & 0x3F);
  }
  i += extra;
  return code;
}

void append_utf8(std::string& out, unsigned code) {
  if (code < 0x80) {
    out += static_cast<char>(code);
  } else if (code < 0x800) {
    out += static_cast<char>(0xC0 | (code >> 6));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else if (code < 0x10000) {
    out += static_cast<char>(0xE0 | (code >> 12));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code >> 18));
    out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code & 0x3F));
  }
}

// Python's json.dumps escapes with ensure_ascii=True; matching it keeps the base64 string
// identical to what DeepSpeed would produce for the same hosts.
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else if (c < 0x80) {
          out += static_cast<char>(c);
        } else {
          unsigned code = decode_utf8(text, i);
          if (code >= 0x10000) {
            code -= 0x10000;
            out +=
                fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF));
          } else {
            out += fmt::format("\\u{:04x}", code);
          }
        }
    }
  }
  return out + "\"";
}

class JsonReader {
 public:
  explicit JsonReader(const std::string& text) : text_(text) {}

  ActiveResources read_object() {
    ActiveResources active;
    expect('{');
    if (peek() == '}') {
      ++pos_;
      return finish(active);
    }
    while (true) {
      std::string host = read_string();
      expect(':');
      active.emplace_back(std::move(host), read_int_array());
      char c = next();
      if (c == '}') break;
      if (c != ',') fail("expected ',' or '}'");
    }
    return finish(active);
  }

 private:
  ActiveResources finish(ActiveResources& active) {
    if (peek() != '\0') fail("trailing characters");
    return std::move(active);
  }
  void skip_ws() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  char peek() {
    skip_ws();
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }
  char next() {
    char c = peek();
    if (c == '\0') fail("unexpected end");
    ++pos_;
    return c;
  }
  void expect(char c) {
    if (next() != c) fail(fmt::format("expected '{}'", c));
  }
  [[noreturn]] void fail(const std::string& what) {
    throw WorldInfoError(fmt::format("bad world info JSON at offset {}: {}", pos_, what));
  }
  std::string read_string() {
    expect('"');
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) fail("unterminated string");
      char c = text_[pos_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) fail("unterminated escape");
      char e = text_[pos_++];
      switch (e) {
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'u': {
          unsigned code = read_hex4();
          if (code >= 0xD800 && code < 0xDC00 && text_.compare(pos_, 2, "\\u") == 0) {
            pos_ += 2;
            unsigned low = read_hex4();
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          }
          append_utf8(out, code);
          break;
        }
        default:
          out += e;
      }
    }
  }
  unsigned read_hex4() {
    if (pos_ + 4 > text_.size()) fail("short \\u escape");
    unsigned code = 0;
    for (int k = 0; k < 4; ++k) {
      char h = text_[pos_++];
      int v = std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
              : (h >= 'a' && h <= 'f')                    ? h - 'a' + 10
              : (h >= 'A' && h <= 'F')                    ? h - 'A' + 10
                                                          : -1;
      if (v < 0) fail("bad \\u escape");
      code = code * 16 + static_cast<unsigned>(v);
    }
    return code;
  }
  std::vector<int> read_int_array() {
    std::vector<int> values;
    expect('[');
    if (peek() == ']') {
      ++pos_;
      return values;
    }
    while (true) {
      skip_ws();
      size_t begin = pos_;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
      if (begin == pos_ || pos_ - begin > 9) fail("expected a slot number");
      values.push_back(std::stoi(text_.substr(begin, pos_ - begin)));
      char c = next();
      if (c == ']') return values;
      if (c != ',') fail("expected ',' or ']'");
    }
  }

  const std::string& text_;
  size_t pos_ = 0;
};

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+' || c == '-') return 62;
  if (c == '/' || c == '_') return 63;
  return -1;
}

}  // namespace

std::string world_info_json(const ActiveResources& active) {
  // Same separators as json.dumps: ", " between items and ": " after keys.
  std::string out = "{";
  for (size_t h = 0; h < active.size(); ++h) {
    if (h > 0) out += ", ";
    out += json_string(active[h].first) + ": [";
    const auto& slots = active[h].second;
    for (size_t i = 0; i < slots.size(); ++i) {
      if (i > 0) out += ", ";
      out += std::to_string(slots[i]);
    }
    out += "]";
  }
  return out + "}";
}

std::string encode_world_info(const ActiveResources& active) {
  return base64_urlsafe_encode(world_info_json(active));
}

ActiveResources decode_world_info(const std::string& encoded) {
  const std::string json = base64_decode(encoded);
  return JsonReader(json).read_object();
}

std::string base64_urlsafe_encode(const std::string& bytes) {
  static const char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    unsigned v = (static_cast<unsigned char>(bytes[i]) << 16) |
                 (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                 static_cast<unsigned char>(bytes[i + 2]);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  size_t rest = bytes.size() - i;
  if (rest == 1) {
    unsigned v = static_cast<unsigned char>(bytes[i]) << 16;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += "==";
  } else if (rest == 2) {
    unsigned v = (static_cast<unsigned char>(bytes[i]) << 16) |
                 (static_cast<unsigned char>(bytes[i + 1]) << 8);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

std::string base64_decode(const std::string& text) {
  std::string out;
  unsigned buffer = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=') break;
    int v = base64_value(c);
    if (v < 0) throw WorldInfoError(fmt::format("bad base64 character '{}' in world info", c));
    buffer = (buffer << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((buffer >> bits) & 0xFF);
    }
  }
  return out;
}

}  // namespace dscpp::launcher
