// IndexedDatasetWriter and IndexedDataset: round trips in every token dtype, Megatron's dtype
// rule, empty documents, refused tokens and files, and no half-written files.
#include "dscpp/data/indexed_dataset.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/data/data_test_util.h"

namespace {

using namespace dscpp::data;
using dscpp::data::testing::error_of;
using dscpp::data::testing::TempDir;
namespace fs = std::filesystem;

TEST(IndexedDataset, RoundTripKeepsDocumentsSequencesAndTokensInEveryDtype) {
  TempDir dir;
  struct Case {
    DType dtype;
    int64_t lo, hi;
  };
  for (Case c :
       {Case{DType::UInt8, 0, 255}, Case{DType::Int8, -128, 127}, Case{DType::Int16, -32768, 32767},
        Case{DType::UInt16, 0, 65535}, Case{DType::Int32, INT32_MIN, INT32_MAX},
        Case{DType::Int64, INT64_MIN, INT64_MAX}}) {
    SCOPED_TRACE(dtype_name(c.dtype));
    std::string prefix = dir / dtype_name(c.dtype);
    // doc 0: two sequences; doc 1: empty; doc 2: one sequence with the dtype's extremes.
    std::vector<int64_t> a = {1, 2, 3}, b = {c.hi, 0}, extremes = {c.lo, c.hi, 7};
    {
      IndexedDatasetWriter w(prefix, c.dtype);
      w.add_sequence(a.data(), a.size());
      w.add_sequence(b.data(), b.size());
      w.end_document();
      w.end_document();
      w.add_sequence(extremes.data(), extremes.size());
      w.end_document();
      EXPECT_EQ(w.num_sequences(), 3);
      EXPECT_EQ(w.num_documents(), 3);
      w.finish();
    }
    IndexedDataset ds(prefix);
    EXPECT_EQ(ds.dtype(), c.dtype);
    ASSERT_EQ(ds.num_sequences(), 3);
    ASSERT_EQ(ds.num_documents(), 3);
    EXPECT_EQ(ds.num_tokens(), 8);
    EXPECT_EQ(ds.document_index(0), 0);
    EXPECT_EQ(ds.document_index(1), 2);
    EXPECT_EQ(ds.document_index(2), 2);  // the empty document repeats the index
    EXPECT_EQ(ds.document_index(3), 3);
    auto item = static_cast<int64_t>(dtype_size(c.dtype));
    EXPECT_EQ(ds.sequence_pointer(0), 0);
    EXPECT_EQ(ds.sequence_pointer(1), 3 * item);
    EXPECT_EQ(ds.sequence_pointer(2), 5 * item);
    EXPECT_EQ(ds.sequence(0), a);
    EXPECT_EQ(ds.sequence(1), b);
    EXPECT_EQ(ds.sequence(2), extremes);
    std::vector<int64_t> part(2);
    ds.read(2, 1, 2, part.data());
    EXPECT_EQ(part, (std::vector<int64_t>{c.hi, 7}));
    EXPECT_EQ(fs::file_size(bin_path(prefix)), static_cast<uintmax_t>(8 * item));
    EXPECT_EQ(fs::file_size(idx_path(prefix)), 34u + 3 * 12 + 4 * 8);
  }
}

TEST(IndexedDataset, FollowsMegatronsTokenDtypeRule) {
  EXPECT_EQ(optimal_token_dtype(50257), DType::UInt16);  // GPT-2
  EXPECT_EQ(optimal_token_dtype(65499), DType::UInt16);
  EXPECT_EQ(optimal_token_dtype(65500), DType::Int32);
  EXPECT_EQ(static_cast<int>(DType::UInt16), 8);
  EXPECT_EQ(static_cast<int>(DType::Int32), 4);
}

TEST(IndexedDataset, SequencesAfterTheLastEndDocumentFormALastDocument) {
  TempDir dir;
  std::vector<int32_t> t = {5, 6};
  IndexedDatasetWriter w(dir / "open", DType::UInt16);
  w.add_sequence(t.data(), t.size());
  w.finish();
  IndexedDataset ds(dir / "open");
  EXPECT_EQ(ds.num_documents(), 1);
  EXPECT_EQ(ds.document_index(1), 1);
}

TEST(IndexedDataset, AnEmptyDatasetIsReadable) {
  TempDir dir;
  dscpp::data::testing::write_documents(dir / "empty", {});
  IndexedDataset ds(dir / "empty");
  EXPECT_EQ(ds.num_sequences(), 0);
  EXPECT_EQ(ds.num_documents(), 0);
}

TEST(IndexedDataset, TokenOutsideTheDtypeIsRefusedAndNothingIsLeftBehind) {
  TempDir dir;
  {
    IndexedDatasetWriter w(dir / "big", DType::UInt16);
    std::vector<int32_t> ok = {65535}, bad = {65536}, negative = {-1};
    w.add_sequence(ok.data(), ok.size());
    std::string e = error_of([&] { w.add_sequence(bad.data(), bad.size()); });
    EXPECT_NE(e.find("65536"), std::string::npos) << e;
    EXPECT_NE(e.find("big.bin"), std::string::npos) << e;
    EXPECT_NE(error_of([&] { w.add_sequence(negative.data(), 1); }), "");
    EXPECT_TRUE(fs::exists(dir / "big.bin.tmp"));
  }  // abandoned without finish()
  EXPECT_TRUE(fs::is_empty(dir.path()));
}

TEST(IndexedDataset, FloatDtypesAreRefusedForTokens) {
  TempDir dir;
  EXPECT_NE(error_of([&] { IndexedDatasetWriter w(dir / "f", DType::Float32); }), "");
}

TEST(IndexedDataset, RefusedFilesNameTheFileAndTheProblem) {
  TempDir dir;
  std::string prefix = dscpp::data::testing::write_documents(dir / "d", {{1, 2, 3}, {4}});
  auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto put = [](const std::string& path, const std::string& b) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << b;
  };
  const std::string idx = bytes(idx_path(prefix)), bin = bytes(bin_path(prefix));
  auto expect_refused = [&](const std::string& file, const std::string& word) {
    std::string e = error_of([&] { IndexedDataset ds(prefix); });
    EXPECT_NE(e.find(file), std::string::npos) << e;
    EXPECT_NE(e.find(word), std::string::npos) << e;
  };
  std::string bad = idx;
  bad[3] = 'X';
  put(idx_path(prefix), bad);
  expect_refused(idx_path(prefix), "bad magic");
  put(idx_path(prefix), idx.substr(0, idx.size() - 1));
  expect_refused(idx_path(prefix), "truncated");
  put(idx_path(prefix), idx);
  put(bin_path(prefix), bin.substr(0, bin.size() - 2));
  expect_refused(bin_path(prefix), "truncated");
  fs::remove(bin_path(prefix));
  expect_refused(bin_path(prefix), "cannot open");
}

TEST(IndexedDataset, ReadsOutsideASequenceThrow) {
  TempDir dir;
  IndexedDataset ds(dscpp::data::testing::write_documents(dir / "d", {{1, 2, 3}}));
  int64_t out[4];
  EXPECT_NE(error_of([&] { ds.read(0, 1, 3, out); }), "");
  EXPECT_NE(error_of([&] { ds.read(1, 0, 1, out); }), "");
  EXPECT_NE(error_of([&] { ds.sequence(-1); }), "");
}

}  // namespace
