// GPT2Tokenizer on bad files: each way encoder.json / vocab.bpe can be wrong is refused with a
// DataError naming the file and the position (the byte and line of a JSON syntax error, the
// entry of a bad id, the line of a bad merge), and the bounds hold: a deeply nested file is
// refused at its second bracket, an oversized one before it is read, one of too many entries
// where they begin, a FIFO without blocking.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "dscpp/data/gpt2_tokenizer.h"
#include "tests/data/data_test_util.h"
#include "tests/data/refusal.h"

namespace {

using dscpp::data::DataError;
using dscpp::data::GPT2Tokenizer;
using dscpp::data::testing::has;
using dscpp::data::testing::refusal;
using dscpp::data::testing::TempDir;

// A JSON string literal for `s` (UTF-8), escaping what JSON requires.
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) out += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
  return out + "\"";
}

// The 256 byte tokens of GPT-2's alphabet, ids 0..255, plus `extra` entries (JSON text).
std::string byte_vocab(const std::string& extra = "") {
  std::string v = "{";
  for (int b = 0; b < 256; ++b) {
    char32_t c = GPT2Tokenizer::byte_to_unicode(static_cast<unsigned char>(b));
    std::string s = c < 0x80 ? std::string(1, static_cast<char>(c))
                             : std::string{static_cast<char>(0xC0 | (c >> 6)),
                                           static_cast<char>(0x80 | (c & 0x3F))};
    v += json_string(s) + ": " + std::to_string(b) + (b < 255 ? ", " : "");
  }
  return v + extra + "}";
}

DataError vocab_refusal(const std::string& json) {
  return refusal([&] { GPT2Tokenizer::from_text(json, "v.json", "", "m.txt"); });
}

TEST(TokenizerRefusals, AValidToyVocabularyLoads) {
  GPT2Tokenizer t =
      GPT2Tokenizer::from_text(byte_vocab(", \"ab\": 256"), "v.json", "#version\na b\n", "m.txt");
  EXPECT_EQ(t.encode("abab"), (std::vector<int32_t>{256, 256}));
  EXPECT_EQ(t.vocab_size(), 257);
}

TEST(TokenizerRefusals, JsonSyntaxErrorsNameTheByteAndLine) {
  DataError e = vocab_refusal("{\"a\": 1,\n \"b\": }");
  EXPECT_EQ(e.file(), "v.json");
  EXPECT_EQ(e.position(), "byte 16");
  EXPECT_TRUE(has(e.what(), "line 2, column 7")) << e.what();
  EXPECT_FALSE(has(e.what(), "[json.exception")) << e.what();
  e = vocab_refusal("{\"a\": 1");  // cut short
  EXPECT_TRUE(has(e.what(), "unexpected end of input")) << e.what();
  e = vocab_refusal("{\"\xff\": 1}");  // not UTF-8
  EXPECT_TRUE(has(e.what(), "UTF-8")) << e.what();
  e = vocab_refusal(byte_vocab() + " trailing");
  EXPECT_TRUE(has(e.what(), "end of input")) << e.what();
}

TEST(TokenizerRefusals, AnythingButAFlatObjectOfIdsIsRefusedByEntry) {
  EXPECT_TRUE(has(vocab_refusal("[1, 2]").what(),
                  "expected a JSON object from token to id, found an array"));
  EXPECT_TRUE(has(vocab_refusal("7").what(), "found the number 7"));
  struct Case {
    std::string value, found;
  };
  for (const Case& c :
       {Case{"-1", "the negative number -1"}, Case{"2147483648", "the number 2147483648"},
        Case{"1.5", "the number 1.5"}, Case{"\"7\"", "a string"}, Case{"null", "null"},
        Case{"true", "a boolean"}, Case{"{\"x\": 1}", "an object"}, Case{"[1]", "an array"}}) {
    SCOPED_TRACE(c.value);
    DataError e = vocab_refusal("{\"a\": 1, \"b\": " + c.value + "}");
    EXPECT_EQ(e.position(), "entry 2 ('b')");
    EXPECT_TRUE(has(e.what(), "expected an id (an integer in [0, 2^31)), found " + c.found))
        << e.what();
  }
}

TEST(TokenizerRefusals, DeepNestingIsRefusedAtOnce) {
  // A million brackets: a recursive parser, or a DOM of them, would exhaust the stack.
  DataError e = vocab_refusal("{\"a\": " + std::string(1000000, '['));
  EXPECT_EQ(e.position(), "entry 1 ('a')");
  EXPECT_TRUE(has(e.what(), "found an array")) << e.what();
  e = vocab_refusal(std::string(1000000, '['));
  EXPECT_TRUE(has(e.what(), "found an array")) << e.what();
}

TEST(TokenizerRefusals, VocabularyContentsAreChecked) {
  // Every byte needs its token.
  std::string no_a = byte_vocab();
  no_a.replace(no_a.find("\"a\": 97"), 7, "\"A2\": 97");
  DataError e = vocab_refusal(no_a);
  EXPECT_TRUE(has(e.what(), "missing vocab entry 'a' for byte 0x61")) << e.what();
  // A repeated key keeps its last id, as Python's json.load does.
  GPT2Tokenizer t = GPT2Tokenizer::from_text(byte_vocab(", \"ab\": 300, \"ab\": 256"), "v.json",
                                             "a b\n", "m.txt");
  EXPECT_EQ(t.encode("ab"), (std::vector<int32_t>{256}));
  EXPECT_TRUE(has(refusal([&] { t.decode({300}); }).what(), "v.json: no token has id 300"));
  EXPECT_TRUE(has(refusal([&] { (void)t.eod(); }).what(), "missing vocab entry '<|endoftext|>'"));
}

TEST(TokenizerRefusals, MergeLinesAreNamedByLine) {
  auto merges_refusal = [](const std::string& merges) {
    return refusal([&] { GPT2Tokenizer::from_text(byte_vocab(), "v.json", merges, "m.txt"); });
  };
  DataError e = merges_refusal("#version: 0.2\na b c\n");
  EXPECT_EQ(e.file(), "m.txt");
  EXPECT_EQ(e.position(), "line 2");
  EXPECT_TRUE(has(e.what(), "expected 'left right', got 'a b c'")) << e.what();
  e = merges_refusal("a\n");
  EXPECT_EQ(e.position(), "line 1");
  e = merges_refusal("\n\na b\n");  // "ab" is no entry of this vocabulary
  EXPECT_EQ(e.position(), "line 3");
  EXPECT_TRUE(has(e.what(), "missing vocab entry 'ab' in v.json")) << e.what();
  // A long bad line is quoted in part.
  e = merges_refusal(std::string(100000, 'x') + "\n");
  EXPECT_LT(std::string(e.what()).size(), 400u);
}

TEST(TokenizerRefusals, FilesAreBoundedAndMustBeRegular) {
  TempDir dir;
  const std::string vocab = dir / "encoder.json", merges = dir / "vocab.bpe";
  std::ofstream(vocab) << byte_vocab();
  std::ofstream(merges) << "";
  GPT2Tokenizer ok(vocab, merges);
  EXPECT_EQ(ok.vocab_size(), 256);

  DataError e = refusal([&] { GPT2Tokenizer t(dir / "none.json", merges); });
  EXPECT_EQ(e.file(), dir / "none.json");
  EXPECT_TRUE(has(e.what(), "cannot open")) << e.what();
  e = refusal([&] { GPT2Tokenizer t(dir.path().string(), merges); });
  EXPECT_TRUE(has(e.what(), "is a directory")) << e.what();
  // A FIFO with no writer: an ifstream would block in open.
  const std::string fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  e = refusal([&] { GPT2Tokenizer t(vocab, fifo); });
  EXPECT_EQ(e.file(), fifo);
  EXPECT_TRUE(has(e.what(), "not a regular file")) << e.what();
  // One byte over the bound, as a sparse file: refused from its size, before reading it.
  const std::string big = dir / "big.json";
  std::ofstream(big) << "{";
  const size_t bound = dscpp::data::TokenizerLimits{}.max_file_bytes;
  EXPECT_EQ(bound, size_t{64} << 20);
  ASSERT_EQ(::truncate(big.c_str(), static_cast<off_t>(bound + 1)), 0);
  e = refusal([&] { GPT2Tokenizer t(big, merges); });
  EXPECT_EQ(e.file(), big);
  EXPECT_TRUE(has(e.what(), "67108865 bytes, more than the 67108864")) << e.what();
  // The bound is the caller's to set; the vocabulary's JSON text is ~2 KB.
  e = refusal([&] { GPT2Tokenizer t(vocab, merges, {1000, 1 << 22}); });
  EXPECT_EQ(e.file(), vocab);
  EXPECT_TRUE(has(e.what(), "more than the 1000")) << e.what();
}

TEST(TokenizerRefusals, EntriesAreBounded) {
  dscpp::data::TokenizerLimits limits{1 << 20, 257};
  GPT2Tokenizer ok =
      GPT2Tokenizer::from_text(byte_vocab(", \"ab\": 256"), "v.json", "a b\n", "m.txt", limits);
  EXPECT_EQ(ok.vocab_size(), 257);
  DataError e = refusal([&] {
    GPT2Tokenizer::from_text(byte_vocab(", \"ab\": 256, \"bc\": 257"), "v.json", "", "m.txt",
                             limits);
  });
  EXPECT_EQ(e.position(), "entry 258");
  EXPECT_TRUE(has(e.what(), "more than the 257 entries")) << e.what();
  limits.max_entries = 300;
  std::string merges = "#version: 0.2\n";
  for (int k = 0; k < 301; ++k) merges += "a b\n";
  e = refusal([&] {
    GPT2Tokenizer::from_text(byte_vocab(", \"ab\": 256"), "v.json", merges, "m.txt", limits);
  });
  EXPECT_EQ(e.file(), "m.txt");
  EXPECT_EQ(e.position(), "line 302");
  EXPECT_TRUE(has(e.what(), "more than the 300 merges")) << e.what();
  e = refusal([&] { GPT2Tokenizer::from_text(byte_vocab(), "v.json", "", "m.txt", {100, 300}); });
  EXPECT_EQ(e.file(), "v.json");
}

}  // namespace
