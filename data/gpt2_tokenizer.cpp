// GPT2Tokenizer: the two files, GPT-2's pre-tokenisation regex, and the BPE merge loop.
#include "dscpp/data/gpt2_tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <stdexcept>

#include "dscpp/data/unicode_classes.h"
#include "dscpp/error.h"

namespace dscpp::data {

namespace {

constexpr char32_t kInvalid = 0xFFFFFFFF;  // a byte that starts no valid UTF-8 sequence

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw dscpp::Error(path + ": cannot open the " + what + " file");
  std::ostringstream s;
  s << in.rdbuf();
  if (in.bad()) throw dscpp::Error(path + ": cannot read the " + what + " file");
  return s.str();
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// The code point at s[i] and its length in bytes. Overlong forms, surrogates, values past
// U+10FFFF and truncated sequences are not UTF-8: their first byte alone is kInvalid.
char32_t decode_at(std::string_view s, size_t i, size_t& len) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char b0 = byte(i);
  len = 1;
  if (b0 < 0x80) return b0;
  size_t n;
  char32_t c;
  unsigned char lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2, c = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3, c = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4, c = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return kInvalid;
  }
  if (i + n > s.size()) return kInvalid;
  for (size_t k = 1; k < n; ++k) {
    unsigned char b = byte(i + k);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return kInvalid;
    c = (c << 6) | (b & 0x3F);
  }
  len = n;
  return c;
}

CharClass class_of(char32_t c) {
  if (c < 0x80) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CharClass::Letter;
    if (c >= '0' && c <= '9') return CharClass::Number;
    if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return CharClass::Space;
    return CharClass::Other;
  }
  return c == kInvalid ? CharClass::Other : char_class(c);
}

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the other 68 bytes
// for U+0100.. in byte order, so that no token spelling holds whitespace or control characters.
struct ByteAlphabet {
  char32_t to_unicode[256];
  int to_byte[324];  // -1: no byte

  ByteAlphabet() {
    std::fill(std::begin(to_byte), std::end(to_byte), -1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_unicode[b] = printable ? static_cast<char32_t>(b) : next++;
      to_byte[to_unicode[b]] = b;
    }
  }
};

const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// A token's spelling back to its bytes; false when some character stands for no byte (a
// special token spelled outside the alphabet can never come out of byte-level text).
bool spelling_to_bytes(const std::string& spelling, std::string& out) {
  out.clear();
  for (size_t i = 0; i < spelling.size();) {
    size_t len;
    char32_t c = decode_at(spelling, i, len);
    if (c >= 324 || alphabet().to_byte[c] < 0) return false;
    out += static_cast<char>(alphabet().to_byte[c]);
    i += len;
  }
  return true;
}

std::string spell_byte(unsigned char b) {
  std::string s;
  append_utf8(s, alphabet().to_unicode[b]);
  return s;
}

}  // namespace

char32_t GPT2Tokenizer::byte_to_unicode(unsigned char b) {
  return alphabet().to_unicode[b];
}

GPT2Tokenizer::GPT2Tokenizer(const std::string& vocab_path, const std::string& merges_path)
    : vocab_path_(vocab_path) {
  nlohmann::json vocab_json =
      nlohmann::json::parse(read_file(vocab_path, "vocabulary"), nullptr, false);
  if (vocab_json.is_discarded() || !vocab_json.is_object())
    throw dscpp::Error(vocab_path + ": not a JSON object from token to id");
  std::unordered_map<std::string, int32_t> vocab;
  vocab.reserve(vocab_json.size());
  std::string bytes;
  for (const auto& [token, id_json] : vocab_json.items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() > std::numeric_limits<int32_t>::max())
      throw dscpp::Error(vocab_path + ": the id of '" + token + "' is not an int32 >= 0");
    auto id = id_json.get<int32_t>();
    vocab.emplace(token, id);
    id_to_bytes_[id] = spelling_to_bytes(token, bytes) ? bytes : token;
    id_bound_ = std::max<int64_t>(id_bound_, int64_t{id} + 1);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(spell_byte(static_cast<unsigned char>(b)));
    if (it == vocab.end()) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", b);
      throw dscpp::Error(vocab_path + ": missing vocab entry '" +
                         spell_byte(static_cast<unsigned char>(b)) + "' for byte " + hex);
    }
    byte_id_[b] = it->second;
  }
  if (auto it = vocab.find("<|endoftext|>"); it != vocab.end()) eod_ = it->second;

  std::istringstream merges(read_file(merges_path, "merges"));
  std::string line;
  int64_t line_no = 0, rank = 0;
  while (std::getline(merges, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    size_t space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos)
      throw dscpp::Error(merges_path + ":" + std::to_string(line_no) +
                         ": expected 'left right', got '" + line + "'");
    std::string left = line.substr(0, space), right = line.substr(space + 1);
    auto id_of = [&](const std::string& token) {
      auto it = vocab.find(token);
      if (it == vocab.end())
        throw dscpp::Error(merges_path + ":" + std::to_string(line_no) + ": missing vocab entry '" +
                           token + "' in " + vocab_path);
      return static_cast<uint32_t>(it->second);
    };
    uint64_t key = uint64_t{id_of(left)} << 32 | id_of(right);
    uint32_t merged = id_of(left + right);
    merges_.emplace(key, rank << 32 | merged);  // a repeated pair keeps its first rank
    ++rank;
  }
}

int32_t GPT2Tokenizer::eod() const {
  if (eod_ < 0) throw dscpp::Error(vocab_path_ + ": missing vocab entry '<|endoftext|>'");
  return eod_;
}

std::vector<std::string_view> GPT2Tokenizer::pretokenize(std::string_view s) {
  std::vector<std::string_view> pieces;
  const size_t n = s.size();
  size_t i = 0;
  auto class_at = [&](size_t k, size_t& len) { return class_of(decode_at(s, k, len)); };
  while (i < n) {
    size_t len;
    CharClass first = class_at(i, len);
    // 's|'t|'re|'ve|'m|'ll|'d : case-sensitive, tried before anything else.
    if (s[i] == '\'') {
      size_t match = 0;
      for (std::string_view suffix : {"s", "t", "re", "ve", "m", "ll", "d"}) {
        if (s.substr(i + 1, suffix.size()) == suffix) {
          match = 1 + suffix.size();
          break;
        }
      }
      if (match) {
        pieces.push_back(s.substr(i, match));
        i += match;
        continue;
      }
    }
    //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+ : one optional U+0020, then a run of one class.
    size_t start = i;
    CharClass run = first;
    if (s[i] == ' ' && i + 1 < n) {
      size_t next_len;
      CharClass next = class_at(i + 1, next_len);
      if (next != CharClass::Space) start = i + 1, run = next, len = next_len;
    }
    if (run != CharClass::Space) {
      size_t end = start + len;
      while (end < n && class_at(end, len) == run) end += len;
      pieces.push_back(s.substr(i, end - i));
      i = end;
      continue;
    }
    // \s+(?!\S) | \s+ : a whitespace run; when a non-space follows it, its last character is
    // left to lead the next piece (so " word" keeps its space), unless the run is one long.
    size_t end = i, last = i;
    while (end < n && class_at(end, len) == CharClass::Space) last = end, end += len;
    if (end < n && last > i) end = last;
    pieces.push_back(s.substr(i, end - i));
    i = end;
  }
  return pieces;
}

// Hugging Face's merge loop (tokenizers' Word::merge_all): a queue of adjacent pairs by
// (rank, position); a popped pair that is stale (its left symbol was merged away, or the pair
// there now merges into another token) is skipped. For merges learnt by BPE this is GPT-2's
// "merge every occurrence of the best pair, then look again", in O(n log n) instead of O(n^2):
// a long run of spaces or letters is one piece.
void GPT2Tokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  const size_t n = piece.size();
  if (n == 1) {
    out.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  struct Symbol {
    int32_t id;
    int64_t prev, next;  // -1: none
    bool alive;
  };
  std::vector<Symbol> sym(n);
  for (size_t k = 0; k < n; ++k)
    sym[k] = {byte_id_[static_cast<unsigned char>(piece[k])], static_cast<int64_t>(k) - 1,
              k + 1 < n ? static_cast<int64_t>(k + 1) : -1, true};
  struct Candidate {
    int64_t rank;
    int64_t pos;
    int32_t merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  auto lookup = [&](int32_t left, int32_t right) {
    auto it =
        merges_.find(uint64_t{static_cast<uint32_t>(left)} << 32 | static_cast<uint32_t>(right));
    return it == merges_.end() ? -1 : it->second;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto offer = [&](int64_t pos) {
    int64_t next = sym[pos].next;
    if (next < 0) return;
    int64_t m = lookup(sym[pos].id, sym[next].id);
    if (m >= 0) queue.push({m >> 32, pos, static_cast<int32_t>(m & 0xFFFFFFFF)});
  };
  for (size_t k = 0; k + 1 < n; ++k) offer(static_cast<int64_t>(k));
  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Symbol& left = sym[top.pos];
    if (!left.alive || left.next < 0) continue;
    int64_t m = lookup(left.id, sym[left.next].id);
    if (m < 0 || static_cast<int32_t>(m & 0xFFFFFFFF) != top.merged) continue;
    Symbol& right = sym[left.next];
    left.id = top.merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (left.prev >= 0) offer(left.prev);
    offer(top.pos);
  }
  for (int64_t k = 0; k >= 0; k = sym[k].next) out.push_back(sym[k].id);
}

void GPT2Tokenizer::encode_into(std::string_view text, std::vector<int32_t>& out,
                                BpeCache* cache) const {
  for (std::string_view piece : pretokenize(text)) {
    if (!cache) {
      bpe(piece, out);
      continue;
    }
    auto it = cache->pieces.find(std::string(piece));
    if (it == cache->pieces.end()) {
      if (cache->pieces.size() >= cache->max_entries) cache->pieces.clear();
      std::vector<int32_t> ids;
      bpe(piece, ids);
      it = cache->pieces.emplace(std::string(piece), std::move(ids)).first;
    }
    out.insert(out.end(), it->second.begin(), it->second.end());
  }
}

std::vector<int32_t> GPT2Tokenizer::encode(std::string_view text, BpeCache* cache) const {
  std::vector<int32_t> out;
  encode_into(text, out, cache);
  return out;
}

std::string GPT2Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    auto it = id_to_bytes_.find(id);
    if (it == id_to_bytes_.end())
      throw dscpp::Error(vocab_path_ + ": no token has id " + std::to_string(id));
    out += it->second;
  }
  return out;
}

}  // namespace dscpp::data
