// GPT2Tokenizer: the pre-tokenisation regex on hand-worked cases, GPT-2's byte alphabet, merge
// priority on a hand-made vocabulary, GPT-2's published ids, lossless decoding and file errors.
// (Ids on large real text are compared with Hugging Face in test_bpe_against_hf.py.)
#include "dscpp/data/gpt2_tokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "dscpp/data/unicode_classes.h"
#include "tests/data/data_test_util.h"

namespace {

using dscpp::data::GPT2Tokenizer;
using dscpp::data::testing::error_of;
using dscpp::data::testing::TempDir;
using Pieces = std::vector<std::string>;

const std::string kVocab = std::string(DSCPP_GPT2_BPE_DIR) + "/encoder.json";
const std::string kMerges = std::string(DSCPP_GPT2_BPE_DIR) + "/vocab.bpe";

const GPT2Tokenizer& gpt2() {
  static const GPT2Tokenizer t(kVocab, kMerges);
  return t;
}

Pieces pieces(const std::string& text) {
  Pieces out;
  for (auto p : GPT2Tokenizer::pretokenize(text)) out.emplace_back(p);
  return out;
}

// Each expectation worked out by hand from the regex
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
TEST(Gpt2Pretokenize, SplitsAsGpt2sRegex) {
  EXPECT_EQ(pieces("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(pieces("I'm fine, it's 2024!!"),
            (Pieces{"I", "'m", " fine", ",", " it", "'s", " 2024", "!!"}));
  EXPECT_EQ(pieces("they'll we've you're he'd don't"),
            (Pieces{"they", "'ll", " we", "'ve", " you", "'re", " he", "'d", " don", "'t"}));
  EXPECT_EQ(pieces("IT'S"), (Pieces{"IT", "'", "S"}));  // contractions are case-sensitive
  EXPECT_EQ(pieces("''s"), (Pieces{"''", "s"}));        // the punctuation run takes both quotes
  EXPECT_EQ(pieces("a  b"), (Pieces{"a", " ", " b"}));  // a run leaves its last space to "b"
  EXPECT_EQ(pieces("a \n b"), (Pieces{"a", " \n", " b"}));
  EXPECT_EQ(pieces("x\ny"), (Pieces{"x", "\n", "y"}));  // one whitespace: \s+ alone
  EXPECT_EQ(pieces("end  "), (Pieces{"end", "  "}));    // a run at the end stays whole
  EXPECT_EQ(pieces("  !"), (Pieces{" ", " !"}));
  EXPECT_EQ(pieces(" 123abc"), (Pieces{" 123", "abc"}));
  EXPECT_EQ(pieces(""), Pieces{});
}

TEST(Gpt2Pretokenize, UsesUnicodeClasses) {
  EXPECT_EQ(pieces("café naïve"), (Pieces{"café", " naïve"}));
  // A combining mark (Mn) is neither letter nor number.
  EXPECT_EQ(pieces("e\u0301t\u00e9"), (Pieces{"e", "\u0301", "t\u00e9"}));
  EXPECT_EQ(pieces("x²½Ⅻ"), (Pieces{"x", "²½Ⅻ"}));  // No, No, Nl: one number run
  EXPECT_EQ(pieces("日本語です。"), (Pieces{"日本語です", "。"}));
  // U+00A0 is whitespace but not the optional U+0020 of the word alternatives.
  EXPECT_EQ(pieces("\u00a0word"), (Pieces{"\u00a0", "word"}));
  EXPECT_EQ(pieces("a\u3000\u3000b"), (Pieces{"a", "\u3000", "\u3000", "b"}));
  EXPECT_EQ(pieces("👍🏽 ok"), (Pieces{"👍🏽", " ok"}));  // symbols and modifiers: Other
  // Bytes that are not UTF-8 are Other, one character each.
  EXPECT_EQ(pieces("a\xff\xfe"
                   "b"),
            (Pieces{"a", "\xff\xfe", "b"}));
}

TEST(UnicodeClasses, SpotChecksAgainstTheStandard) {
  using dscpp::data::char_class;
  using dscpp::data::CharClass;
  EXPECT_EQ(char_class(U'é'), CharClass::Letter);     // Ll
  EXPECT_EQ(char_class(U'ǅ'), CharClass::Letter);     // Lt
  EXPECT_EQ(char_class(U'ʰ'), CharClass::Letter);     // Lm
  EXPECT_EQ(char_class(U'中'), CharClass::Letter);    // Lo
  EXPECT_EQ(char_class(0x20000), CharClass::Letter);  // CJK extension B
  EXPECT_EQ(char_class(U'٣'), CharClass::Number);     // Nd
  EXPECT_EQ(char_class(U'Ⅻ'), CharClass::Number);     // Nl
  EXPECT_EQ(char_class(U'½'), CharClass::Number);     // No
  EXPECT_EQ(char_class(0x0301), CharClass::Other);    // Mn
  EXPECT_EQ(char_class(0x200B), CharClass::Other);    // zero width space: not White_Space
  EXPECT_EQ(char_class(0x0085), CharClass::Space);
  EXPECT_EQ(char_class(0x3000), CharClass::Space);
  EXPECT_EQ(char_class(0xE000), CharClass::Other);  // private use
  EXPECT_EQ(char_class(0x10FFFF), CharClass::Other);
  EXPECT_EQ(char_class(0x110000), CharClass::Other);
  EXPECT_EQ(char_class(0x105C0), CharClass::Letter);  // Todhri, new in Unicode 16.0
  EXPECT_STREQ(dscpp::data::kUnicodeVersion, "16.0.0");
}

TEST(Gpt2Tokenizer, ByteAlphabetIsGpt2s) {
  std::set<char32_t> seen;
  for (int b = 0; b < 256; ++b)
    seen.insert(GPT2Tokenizer::byte_to_unicode(static_cast<unsigned char>(b)));
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(GPT2Tokenizer::byte_to_unicode('!'), U'!');
  EXPECT_EQ(GPT2Tokenizer::byte_to_unicode(' '), U'Ġ');   // U+0120
  EXPECT_EQ(GPT2Tokenizer::byte_to_unicode('\n'), U'Ċ');  // U+010A
  EXPECT_EQ(GPT2Tokenizer::byte_to_unicode(0xAD), U'Ń');  // U+0143, the last of the 68
}

// Ids published with GPT-2 (OpenAI's encoder, tiktoken's gpt2 tests).
TEST(Gpt2Tokenizer, MatchesGpt2sPublishedIds) {
  const auto& t = gpt2();
  EXPECT_EQ(t.vocab_size(), 50257);
  EXPECT_EQ(t.eod(), 50256);
  EXPECT_EQ(t.encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(t.encode("<|endoftext|>"), (std::vector<int32_t>{27, 91, 437, 1659, 5239, 91, 29}));
}

TEST(Gpt2Tokenizer, DecodeGivesBackEveryByte) {
  const auto& t = gpt2();
  std::mt19937 rng(5);
  for (int round = 0; round < 200; ++round) {
    std::string s(rng() % 64, '\0');
    for (auto& c : s) c = static_cast<char>(rng() % 256);
    EXPECT_EQ(t.decode(t.encode(s)), s);
  }
  std::string text = "Grüße, 世界! 👨‍👩‍👧 e\u0301 \t\n  done";
  EXPECT_EQ(t.decode(t.encode(text)), text);
}

TEST(Gpt2Tokenizer, CacheDoesNotChangeIds) {
  const auto& t = gpt2();
  dscpp::data::BpeCache cache;
  cache.max_entries = 3;  // cleared often
  std::string text = "the cat and the hat and the bat sat on the mat; the end";
  for (int k = 0; k < 3; ++k) EXPECT_EQ(t.encode(text, &cache), t.encode(text));
}

// A hand-made vocabulary: byte b has id b (spelled in GPT-2's alphabet), then "ab", "bc",
// "abc", "aa". Which merge wins for "abc" depends only on the merges' order.
struct ToyFiles {
  TempDir dir;
  std::string vocab = dir / "vocab.json", merges = dir / "merges.txt";
  explicit ToyFiles(const std::string& merge_lines, bool drop_byte_z = false) {
    std::ofstream v(vocab);
    v << "{";
    for (int b = 0; b < 256; ++b) {
      if (drop_byte_z && b == 'z') continue;
      std::string s;
      char32_t c = GPT2Tokenizer::byte_to_unicode(static_cast<unsigned char>(b));
      if (c < 0x80) {
        s = (c == '"' || c == '\\') ? std::string("\\") + static_cast<char>(c)
                                    : std::string(1, static_cast<char>(c));
      } else {
        s = std::string(1, static_cast<char>(0xC0 | (c >> 6))) +
            static_cast<char>(0x80 | (c & 0x3F));
      }
      v << "\"" << s << "\": " << b << ", ";
    }
    v << "\"ab\": 256, \"bc\": 257, \"abc\": 258, \"aa\": 259}";
    std::ofstream(merges) << "#version: 0.2\n" << merge_lines;
  }
};

TEST(Gpt2Tokenizer, LowerRankMergesFirst) {
  ToyFiles ab_first("a b\nab c\nb c\n");
  GPT2Tokenizer t1(ab_first.vocab, ab_first.merges);
  EXPECT_EQ(t1.encode("abc"), (std::vector<int32_t>{258}));
  EXPECT_EQ(t1.encode("abcbc"), (std::vector<int32_t>{258, 257}));
  ToyFiles bc_first("b c\na b\nab c\n");
  GPT2Tokenizer t2(bc_first.vocab, bc_first.merges);
  EXPECT_EQ(t2.encode("abc"), (std::vector<int32_t>{'a', 257}));
  EXPECT_EQ(t2.encode("ababx"), (std::vector<int32_t>{256, 256, 'x'}));
  EXPECT_EQ(t2.vocab_size(), 260);
  EXPECT_THROW(t2.eod(), std::runtime_error);  // no <|endoftext|> in this vocabulary
}

// Equal ranks (the same pair several times) merge left to right: "aaa" is "aa" + "a".
TEST(Gpt2Tokenizer, EqualRanksMergeLeftmostFirst) {
  ToyFiles files("a a\n");
  GPT2Tokenizer t(files.vocab, files.merges);
  EXPECT_EQ(t.encode("aaa"), (std::vector<int32_t>{259, 'a'}));
  EXPECT_EQ(t.encode("aaaaa"), (std::vector<int32_t>{259, 259, 'a'}));
}

TEST(Gpt2Tokenizer, BadFilesAreNamedWithTheProblem) {
  ToyFiles unknown("a b\nq r\n");  // "qr" is no vocabulary entry
  std::string e = error_of([&] { GPT2Tokenizer t(unknown.vocab, unknown.merges); });
  EXPECT_NE(e.find(unknown.merges + ": line 3"), std::string::npos) << e;
  EXPECT_NE(e.find("missing vocab entry 'qr'"), std::string::npos) << e;

  ToyFiles malformed("a b c\n");
  e = error_of([&] { GPT2Tokenizer t(malformed.vocab, malformed.merges); });
  EXPECT_NE(e.find(malformed.merges + ": line 2"), std::string::npos) << e;

  ToyFiles no_z("a b\n", /*drop_byte_z=*/true);
  e = error_of([&] { GPT2Tokenizer t(no_z.vocab, no_z.merges); });
  EXPECT_NE(e.find("missing vocab entry 'z'"), std::string::npos) << e;

  e = error_of([&] { GPT2Tokenizer t(unknown.dir / "nope.json", unknown.merges); });
  EXPECT_NE(e.find("nope.json"), std::string::npos) << e;
  std::ofstream(unknown.dir / "bad.json") << "[1, 2]";
  e = error_of([&] { GPT2Tokenizer t(unknown.dir / "bad.json", unknown.merges); });
  EXPECT_NE(e.find("bad.json: expected a JSON object"), std::string::npos) << e;
}

}  // namespace
