// GPT-2's byte-level BPE tokenizer, id for id what OpenAI's encoder.py and Hugging Face's
// ByteLevel BPE (add_prefix_space=false) produce from the same two files.
//
// Files: the vocabulary (encoder.json / vocab.json: a JSON object from token to id, tokens
// spelled in GPT-2's bytes-to-unicode alphabet) and the merges (vocab.bpe / merges.txt: an
// optional "#version" line, then one "left right" pair per line, earliest = highest priority).
// Text is UTF-8. It is cut by GPT-2's regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (Unicode classes from unicode_classes.h; bytes that are not valid UTF-8 count as Other), each
// piece's bytes become byte tokens, and merges apply lowest rank first, every occurrence left to
// right, until none applies. "<|endoftext|>" in the text is ordinary text, as in GPT-2's encoder;
// eod() gives its id for the end of a document. An immutable tokenizer is safe to share between
// threads; a BpeCache belongs to one thread. Errors throw DataError naming the file and the
// position (the byte of a JSON syntax error, the entry of a bad id, the line of a bad merge).
// Bounds (TokenizerLimits): each file's size (checked before reading) and its number of entries
// (tokens, merge lines), so memory stays proportional to a real vocabulary; the vocabulary is
// exactly one flat object (nesting is refused where it starts, never recursed into).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dscpp::data {

// Pieces already merged, for one thread. Bounded: cleared when it grows past max_entries.
struct BpeCache {
  std::unordered_map<std::string, std::vector<int32_t>> pieces;
  size_t max_entries = 1 << 16;
};

// Far above any real tokenizer (GPT-2: 1 MiB and 50,257 tokens; 256K-token vocabularies: ~10
// MiB), far below what would exhaust memory.
struct TokenizerLimits {
  size_t max_file_bytes = size_t{64} << 20;  // each of the two files
  int64_t max_entries = int64_t{1} << 22;    // vocabulary entries; merge lines
};

class GPT2Tokenizer {
 public:
  GPT2Tokenizer(const std::string& vocab_path, const std::string& merges_path,
                const TokenizerLimits& limits = {});
  // The same from the files' contents; the names are for messages (the fuzzer, tests).
  static GPT2Tokenizer from_text(const std::string& vocab_json, const std::string& vocab_name,
                                 const std::string& merges_text, const std::string& merges_name,
                                 const TokenizerLimits& limits = {});

  std::vector<int32_t> encode(std::string_view text, BpeCache* cache = nullptr) const;
  // Appends the ids of `text` to `out`.
  void encode_into(std::string_view text, std::vector<int32_t>& out,
                   BpeCache* cache = nullptr) const;
  // The bytes the ids stand for (decode(encode(t)) == t for any t). Throws on an unknown id.
  std::string decode(const std::vector<int32_t>& ids) const;

  // Id of "<|endoftext|>"; throws if the vocabulary has none.
  int32_t eod() const;
  // Entries in the vocabulary (50257 for GPT-2's), as Megatron's vocab_size.
  int64_t vocab_size() const { return static_cast<int64_t>(id_to_bytes_.size()); }
  // Largest id + 1 (ids need not be dense in any vocabulary file).
  int64_t id_bound() const { return id_bound_; }

  // The pieces GPT-2's regex cuts `text` into, as views into it.
  static std::vector<std::string_view> pretokenize(std::string_view text);
  // GPT-2's bytes_to_unicode(): the printable code point standing for each byte.
  static char32_t byte_to_unicode(unsigned char b);

 private:
  GPT2Tokenizer() = default;
  void load(const std::string& vocab_json, const std::string& vocab_path,
            const std::string& merges_text, const std::string& merges_path,
            const TokenizerLimits& limits);
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;

  std::string vocab_path_;
  int32_t byte_id_[256] = {};                             // the token of each single byte
  std::unordered_map<uint64_t, int64_t> merges_;          // (left << 32 | right) -> rank << 32 | id
  std::unordered_map<int32_t, std::string> id_to_bytes_;  // for decode
  int32_t eod_ = -1;                                      // -1: no "<|endoftext|>"
  int64_t id_bound_ = 0;
};

}  // namespace dscpp::data
