// What the data tests share: a temporary directory, small indexed datasets, and the message of
// an error.
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "dscpp/data/indexed_dataset.h"

namespace dscpp::data::testing {

// A fresh directory under $TMPDIR, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "dscpp_data_XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// Writes one sequence per document (an empty document gets none) and returns the prefix.
inline std::string write_documents(const std::string& prefix,
                                   const std::vector<std::vector<int32_t>>& docs,
                                   DType dtype = DType::UInt16) {
  IndexedDatasetWriter w(prefix, dtype);
  for (const auto& d : docs) w.add_document(d);
  w.finish();
  return prefix;
}

// `n` documents of varying length (1 .. 37 tokens) with distinct, recognisable tokens.
inline std::vector<std::vector<int32_t>> numbered_documents(int n) {
  std::vector<std::vector<int32_t>> docs;
  int32_t next = 1;
  for (int d = 0; d < n; ++d) {
    std::vector<int32_t> doc;
    for (int k = 0; k < 1 + (d * 7) % 37; ++k) doc.push_back(next++);
    docs.push_back(doc);
  }
  return docs;
}

// The message of the std::runtime_error `f` throws ("" if none).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace dscpp::data::testing
