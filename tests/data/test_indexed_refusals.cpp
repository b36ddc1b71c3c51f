// IndexedDataset on bad files: each way an .idx/.bin pair can be wrong is refused with a
// DataError naming the file and the position of the bad field (byte offsets worked out from
// Megatron's layout by hand), never a crash, an allocation sized by a count, or a hang; and a
// token id past the model's vocabulary is named by document, sequence, token and id.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/data/gpt_dataset.h"
#include "dscpp/data/indexed_dataset.h"
#include "tests/data/data_test_util.h"
#include "tests/data/refusal.h"

namespace {

using namespace dscpp::data;
using dscpp::data::testing::has;
using dscpp::data::testing::refusal;
using dscpp::data::testing::TempDir;
using dscpp::data::testing::write_documents;
namespace fs = std::filesystem;

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void put_file(const std::string& path, const std::string& b) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << b;
}
template <typename T>
std::string with(std::string b, size_t offset, T value) {
  // Byte by byte, through replace: g++ 13 -O3 cannot see the offset in range and flags a
  // memcpy into b.data() as an overflow (-Wstringop-overflow).
  char raw[sizeof value];
  std::memcpy(raw, &value, sizeof value);
  b.replace(offset, sizeof value, raw, sizeof value);
  return b;
}

// Four documents in uint16, the third empty: S = 3 sequences, D + 1 = 5 document indices
// (0, 1, 2, 2, 3); lengths at byte 34, pointers at 46, document indices at 70; .bin is 2 * 8 =
// 16 bytes.
class BadIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix = write_documents(dir / "d", {{1, 2, 3}, {4}, {}, {5, 6, 7, 8}});
    idx = bytes_of(idx_path(prefix));
    bin = bytes_of(bin_path(prefix));
    ASSERT_EQ(idx.size(), 34u + 3 * 12 + 5 * 8);
    ASSERT_EQ(bin.size(), 16u);
  }
  // The refusal of `bad_idx` (and `bad_bin`) in place of the good files.
  DataError refused(const std::string& bad_idx, const std::string& bad_bin) {
    put_file(idx_path(prefix), bad_idx);
    put_file(bin_path(prefix), bad_bin);
    return refusal([&] { IndexedDataset ds(prefix); });
  }
  void expect(const std::string& bad_idx, const std::string& bad_bin, const std::string& file,
              const std::string& position, const std::string& word) {
    DataError e = refused(bad_idx, bad_bin);
    EXPECT_EQ(e.file(), file) << e.what();
    EXPECT_EQ(e.position(), position) << e.what();
    EXPECT_TRUE(has(e.what(), word)) << e.what();
  }

  TempDir dir;
  std::string prefix, idx, bin;
};

TEST_F(BadIndex, HeaderFieldsAreRefusedAtTheirByte) {
  const std::string i = idx_path(prefix);
  expect(idx.substr(0, 33), bin, i, "", "the header alone is 34");
  expect(with(idx, 3, 'X'), bin, i, "byte 0", "bad magic");
  expect(with(idx, 9, uint64_t{2}), bin, i, "byte 9", "unsupported version 2");
  expect(with(idx, 17, uint8_t{9}), bin, i, "byte 17", "unknown dtype code 9");
  expect(with(idx, 17, uint8_t{0}), bin, i, "byte 17", "unknown dtype code 0");
  expect(with(idx, 17, uint8_t{6}), bin, i, "byte 17", "float64 does not hold tokens");
}

TEST_F(BadIndex, CountsAreCheckedAgainstTheFileSizeWithoutOverflow) {
  const std::string i = idx_path(prefix);
  // 34 + 3 * 12 + 6 * 8 = 118 > 110 bytes.
  expect(with(idx, 26, uint64_t{6}), bin, i, "", "need 118");
  expect(idx.substr(0, idx.size() - 1), bin, i, "", "109 bytes");
  // 2^62 sequences: 12 * 2^62 wraps 64 bits; the check must not wrap into "small enough".
  expect(with(idx, 18, uint64_t{1} << 62), bin, i, "", "more than 2^64");
  expect(with(idx, 26, ~uint64_t{0}), bin, i, "", "more than 2^64");
  // A large honest-looking count is refused by size, before anything is allocated or read.
  expect(with(idx, 18, uint64_t{1} << 40), bin, i, "", "need 13194139533386");
}

TEST_F(BadIndex, DocumentIndicesAreRefusedAtTheirByte) {
  const std::string i = idx_path(prefix);
  expect(with(with(idx, 26, uint64_t{0}), 18, uint64_t{0}), bin, i, "byte 26",
         "no document indices");
  expect(with(idx, 70, int64_t{1}), bin, i, "byte 70", "start with 0, not 1");
  expect(with(idx, 70 + 16, int64_t{0}), bin, i, "byte 86", "decrease at entry 2 (1, then 0)");
  expect(with(idx, 70 + 32, int64_t{2}), bin, i, "byte 102", "last document index is 2");
}

TEST_F(BadIndex, SequencesAreRefusedAtTheirByteOrByTheDataFile) {
  const std::string i = idx_path(prefix), b = bin_path(prefix);
  expect(with(idx, 34 + 4, int32_t{-1}), bin, i, "byte 38", "sequence 1 has a negative length");
  expect(with(idx, 46 + 8, int64_t{-2}), bin, i, "byte 54", "sequence 1 has a negative pointer");
  expect(with(idx, 46 + 8, int64_t{17}), bin, b, "", "sequence 1 (1 tokens at byte 17)");
  // pointer + length * 2 is past 2^63, where the int64 sum would overflow: refused, not wrapped.
  expect(with(idx, 46 + 16, std::numeric_limits<int64_t>::max() - 1), bin, b, "",
         "lies past the file's end (16 bytes)");
  expect(with(idx, 34 + 8, std::numeric_limits<int32_t>::max()), bin, b, "",
         "sequence 2 (2147483647 tokens");
  expect(idx, bin.substr(0, 15), b, "", "truncated data");
}

// Megatron writes the sequences back to back from byte 0 (pointers 0, 6, 8 here) and the .bin
// is exactly as long as they are: a pointer elsewhere, a dtype code of another width, or an
// index beside a .bin it does not describe is refused, naming both ends of the mismatch.
TEST_F(BadIndex, SequencesMustLieBackToBackAndFillTheDataFile) {
  const std::string i = idx_path(prefix), b = bin_path(prefix);
  // uint16 read as uint8: sequence 0 ends at byte 3, sequence 1 starts at 6; the pointers step
  // by 6 / 3 = 2 bytes a token.
  DataError e = refused(with(idx, 17, uint8_t{1}), bin);
  EXPECT_EQ(e.file(), i);
  EXPECT_EQ(e.position(), "byte 54");
  EXPECT_TRUE(has(e.what(), "sequence 1 starts at byte 6 of " + b +
                                ", not at 3 where sequence 0 (3 tokens of 1 bytes) ends"))
      << e.what();
  EXPECT_TRUE(has(e.what(),
                  "the pointers step by 2 bytes a token, but the dtype code (byte 17) "
                  "says uint8 (1)"))
      << e.what();
  // Read as int32: sequence 0 would end at byte 12.
  expect(with(idx, 17, uint8_t{4}), bin, i, "byte 54", "not at 12 where sequence 0");
  // Two pointers aliased: sequence 2 starts where sequence 1 does (byte 6), not at 8.
  e = refused(with(idx, 46 + 16, int64_t{6}), bin);
  EXPECT_EQ(e.position(), "byte 62");
  EXPECT_TRUE(has(e.what(), "sequence 2 starts at byte 6 of " + b +
                                ", not at 8 where sequence 1 (1 tokens of 2 bytes) ends"))
      << e.what();
  EXPECT_FALSE(has(e.what(), "step by")) << e.what();
  // The first sequence must start the file.
  expect(with(idx, 46, int64_t{2}), bin, i, "byte 46",
         "sequence 0 starts at byte 2 of " + b + ", not at 0 (the first sequence starts the file)");
  // A .bin longer than the sequences: 18 bytes for 8 uint16 tokens.
  expect(idx, bin + "xy", b, "",
         "18 bytes, but its index " + i +
             " describes 3 sequences of 8 tokens in uint16 (2 bytes each) = 16 bytes");
  // A shorter index of another corpus beside this .bin: 1 sequence of 2 tokens, 4 bytes.
  const std::string other = bytes_of(idx_path(write_documents(dir / "other", {{9, 9}})));
  expect(other, bin, b, "", "16 bytes, but its index " + i + " describes 1 sequences of 2 tokens");
}

TEST_F(BadIndex, OnlyRegularFilesAreOpened) {
  fs::remove(idx_path(prefix));
  DataError e = refusal([&] { IndexedDataset ds(prefix); });
  EXPECT_EQ(e.file(), idx_path(prefix));
  EXPECT_TRUE(has(e.what(), "cannot open")) << e.what();
  fs::create_directory(idx_path(prefix));
  e = refusal([&] { IndexedDataset ds(prefix); });
  EXPECT_TRUE(has(e.what(), "is a directory")) << e.what();
  fs::remove(idx_path(prefix));
  put_file(idx_path(prefix), idx);
  // A FIFO with no writer: opening it for reading would block forever.
  fs::remove(bin_path(prefix));
  ASSERT_EQ(::mkfifo(bin_path(prefix).c_str(), 0600), 0);
  e = refusal([&] { IndexedDataset ds(prefix); });
  EXPECT_EQ(e.file(), bin_path(prefix));
  EXPECT_TRUE(has(e.what(), "not a regular file")) << e.what();
}

TEST_F(BadIndex, ReadsWithOverflowingArgumentsAreRefused) {
  IndexedDataset ds(prefix);
  int64_t out[4];
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_TRUE(has(refusal([&] { ds.read(0, 1, big, out); }).what(), "out of range"));
  EXPECT_TRUE(has(refusal([&] { ds.read(0, big, 1, out); }).what(), "out of range"));
  EXPECT_TRUE(has(refusal([&] { ds.read(0, -1, 1, out); }).what(), "out of range"));
  EXPECT_TRUE(has(refusal([&] { ds.sequence(3); }).what(), "no sequence 3"));
}

TEST_F(BadIndex, InMemoryIndexIsCheckedAlike) {
  auto u = [](const std::string& s) { return reinterpret_cast<const unsigned char*>(s.data()); };
  IndexedDataset ok("mem", u(idx), idx.size(), u(bin), bin.size());
  EXPECT_EQ(ok.sequence(2), (std::vector<int64_t>{5, 6, 7, 8}));
  std::string bad = with(idx, 70 + 32, int64_t{2});
  DataError e = refusal([&] { IndexedDataset ds("mem", u(bad), bad.size(), u(bin), bin.size()); });
  EXPECT_EQ(e.file(), "mem.idx");
  EXPECT_EQ(e.position(), "byte 102");
  EXPECT_EQ(IndexedDataset::index_size(u(idx), idx.size()), idx.size());
  EXPECT_EQ(IndexedDataset::index_size(u(idx), 33), 0u);
}

// Documents: 0 = {1, 2, 3}, 1 = {} (no sequence), 2 = {4, 900, 5} with 900 past a vocabulary
// of 900; in the file's sequences that is sequence 1, token 1, at byte 2 * (3 + 1) = 8.
TEST(TokenIds, AnIdPastTheVocabularyIsNamedByDocumentTokenAndId) {
  TempDir dir;
  IndexedDataset ds(write_documents(dir / "v", {{1, 2, 3}, {}, {4, 900, 5}}));
  ds.check_token_ids(901);  // every id below 901: accepted
  DataError e = refusal([&] { ds.check_token_ids(900); });
  EXPECT_EQ(e.file(), bin_path(dir / "v"));
  EXPECT_EQ(e.position(), "document 2, sequence 1, token 1 (byte 8)");
  EXPECT_TRUE(has(e.what(), "token id 900 is outside the vocabulary [0, 900)")) << e.what();
  EXPECT_TRUE(has(refusal([&] { ds.check_token_ids(0); }).what(), "vocab_size must be >= 1"));
}

TEST(TokenIds, NegativeIdsAreRefusedInSignedDtypes) {
  TempDir dir;
  for (DType t : {DType::Int8, DType::Int16, DType::Int32, DType::Int64}) {
    SCOPED_TRACE(dtype_name(t));
    std::string p = write_documents(dir / dtype_name(t), {{5, -1}}, t);
    IndexedDataset ds(p);
    DataError e = refusal([&] { ds.check_token_ids(100); });
    EXPECT_EQ(e.position(),
              "document 0, sequence 0, token 1 (byte " + std::to_string(dtype_size(t)) + ")");
    EXPECT_TRUE(has(e.what(), "token id -1")) << e.what();
  }
}

TEST(TokenIds, UnsignedDtypesWithinTheVocabularyNeedNoScan) {
  TempDir dir;
  IndexedDataset u16(write_documents(dir / "u16", {{0, 65535}}, DType::UInt16));
  u16.check_token_ids(65536);  // any uint16 is an id: accepted without reading
  EXPECT_TRUE(has(refusal([&] { u16.check_token_ids(65535); }).what(), "token id 65535"));
  IndexedDataset u8(write_documents(dir / "u8", {{255}}, DType::UInt8));
  u8.check_token_ids(256);
  EXPECT_TRUE(has(refusal([&] { u8.check_token_ids(255); }).what(), "token id 255"));
}

// A dtype that cannot hold the vocabulary's ids was not the one the file was written with:
// refused at the .idx's dtype byte before any token is read. The largest vocabulary each holds
// (256 for uint8, 65536 for uint16, 32768 for int16) is accepted.
TEST(TokenIds, ADtypeTooNarrowForTheVocabularyIsRefusedAtItsCode) {
  TempDir dir;
  IndexedDataset u8(write_documents(dir / "u8", {{1, 2}}, DType::UInt8));
  DataError e = refusal([&] { u8.check_token_ids(50257); });
  EXPECT_EQ(e.file(), idx_path(dir / "u8"));
  EXPECT_EQ(e.position(), "byte 17");
  EXPECT_TRUE(has(e.what(), "dtype uint8 holds token ids up to 255, but the vocabulary has 50257"))
      << e.what();
  u8.check_token_ids(256);
  IndexedDataset u16(write_documents(dir / "u16", {{1, 2}}, DType::UInt16));
  EXPECT_TRUE(has(refusal([&] { u16.check_token_ids(65537); }).what(),
                  "dtype uint16 holds token ids up to 65535, but the vocabulary has 65537"));
  u16.check_token_ids(65536);
  IndexedDataset i16(write_documents(dir / "i16", {{1, 2}}, DType::Int16));
  EXPECT_TRUE(has(refusal([&] { i16.check_token_ids(32769); }).what(), "up to 32767"));
  i16.check_token_ids(32768);
  IndexedDataset i32(write_documents(dir / "i32", {{1, 2}}, DType::Int32));
  i32.check_token_ids(50257);
  // Through the GPT dataset, as train_gpt builds it with the model's vocabulary.
  auto shared = std::make_shared<const IndexedDataset>(dir / "u8");
  e = refusal([&] { GPTDataset g(shared, GPTDatasetOptions{1, 1, true, 50257}); });
  EXPECT_EQ(e.position(), "byte 17");
}

// What train_gpt relies on: a dataset given the model's vocabulary refuses the file when it is
// built, before any batch exists; without one, the same file is accepted.
TEST(TokenIds, GPTDatasetChecksTheModelsVocabularyWhenBuilt) {
  TempDir dir;
  auto ds = std::make_shared<const IndexedDataset>(
      write_documents(dir / "g", {{1, 2, 3, 4}, {5, 50257, 6}}));
  GPTDataset unchecked(ds, GPTDatasetOptions{2, 1, true, 0});
  EXPECT_EQ(unchecked.samples_per_epoch(), 3);
  DataError e = refusal([&] { GPTDataset g(ds, GPTDatasetOptions{2, 1, true, 50257}); });
  EXPECT_EQ(e.file(), bin_path(dir / "g"));
  EXPECT_EQ(e.position(), "document 1, sequence 1, token 1 (byte 10)");
  EXPECT_TRUE(has(e.what(), "token id 50257 is outside the vocabulary [0, 50257)")) << e.what();
  GPTDataset ok(ds, GPTDatasetOptions{2, 1, true, 50258});
  EXPECT_EQ(ok.samples_per_epoch(), 3);
}

}  // namespace
