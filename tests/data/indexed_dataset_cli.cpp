// indexed_dataset_cli write PREFIX DTYPE DOCS.json   writes documents (a JSON list of documents,
//                                                    each a list of sequences of tokens)
// indexed_dataset_cli dump PREFIX                    prints the dataset as JSON
// For test_indexed_format.py. Exit status 1 with the error on stderr when a file is refused.
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "dscpp/data/indexed_dataset.h"

namespace data = dscpp::data;

namespace {

data::DType parse_dtype(const std::string& name) {
  for (int code = 1; code <= 8; ++code)
    if (name == data::dtype_name(static_cast<data::DType>(code)))
      return static_cast<data::DType>(code);
  throw std::runtime_error("unknown dtype " + name);
}

void write(const std::string& prefix, const std::string& dtype, const std::string& docs_path) {
  std::ifstream in(docs_path);
  nlohmann::json docs = nlohmann::json::parse(in);
  data::IndexedDatasetWriter writer(prefix, parse_dtype(dtype));
  for (const auto& doc : docs) {
    for (const auto& seq : doc) {
      std::vector<int64_t> tokens = seq.get<std::vector<int64_t>>();
      writer.add_sequence(tokens.data(), tokens.size());
    }
    writer.end_document();
  }
  writer.finish();
}

void dump(const std::string& prefix) {
  data::IndexedDataset ds(prefix);
  nlohmann::json out;
  out["dtype"] = data::dtype_name(ds.dtype());
  out["num_sequences"] = ds.num_sequences();
  out["num_documents"] = ds.num_documents();
  out["num_tokens"] = ds.num_tokens();
  auto& lengths = out["sequence_lengths"] = nlohmann::json::array();
  auto& pointers = out["sequence_pointers"] = nlohmann::json::array();
  auto& doc_index = out["document_indices"] = nlohmann::json::array();
  auto& docs = out["documents"] = nlohmann::json::array();
  for (int64_t i = 0; i < ds.num_sequences(); ++i) {
    lengths.push_back(ds.sequence_length(i));
    pointers.push_back(ds.sequence_pointer(i));
  }
  for (int64_t d = 0; d <= ds.num_documents(); ++d) doc_index.push_back(ds.document_index(d));
  for (int64_t d = 0; d < ds.num_documents(); ++d) {
    nlohmann::json doc = nlohmann::json::array();
    for (int64_t i = ds.document_index(d); i < ds.document_index(d + 1); ++i)
      doc.push_back(ds.sequence(i));
    docs.push_back(doc);
  }
  std::cout << out.dump() << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "write" && argc == 5) {
      write(argv[2], argv[3], argv[4]);
    } else if (cmd == "dump" && argc == 3) {
      dump(argv[2]);
    } else {
      std::cerr << "usage: indexed_dataset_cli write PREFIX DTYPE DOCS.json | dump PREFIX\n";
      return 2;
    }
  } catch (const std::exception& e) {
    std::cerr << "indexed_dataset_cli: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
