// Megatron-LM's indexed dataset (megatron/core/datasets/indexed_dataset.py): tokens in
// `<prefix>.bin`, their index in `<prefix>.idx`; written and memory-mapped here, no LibTorch.
//
// .bin: every sequence's tokens back to back, little-endian, in the index's dtype.
// .idx, little-endian, packed (no alignment padding):
//   9 bytes   "MMIDIDX\0\0"
//   uint64    version, 1
//   uint8     dtype code (DType below)
//   uint64    S, the number of sequences
//   uint64    D + 1, the number of entries in document_indices
//   int32[S]  sequence lengths, in tokens
//   int64[S]  sequence pointers: byte offset of each sequence in .bin
//   int64[D+1] document indices: document d is sequences [doc[d], doc[d+1]); doc[0] = 0,
//             doc[D] = S. A document with no tokens has no sequence (an index repeats).
//   (a multimodal file then has int8[S] sequence modes; read past, not written)
// Errors (missing or not a regular file, bad magic, version, dtype, truncated or inconsistent
// file, a token out of its dtype's range or the vocabulary) throw DataError naming the file and,
// where there is one, the position (the byte of the bad field, the document and token).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "dscpp/data/data_error.h"

namespace dscpp::data {

// Megatron's DType codes (numpy types).
enum class DType : uint8_t {
  UInt8 = 1,
  Int8 = 2,
  Int16 = 3,
  Int32 = 4,
  Int64 = 5,
  Float64 = 6,
  Float32 = 7,
  UInt16 = 8,
};

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // numpy's name: "uint16"
// Megatron's DType.optimal_dtype: uint16 when the vocabulary has fewer than 65500 entries.
DType optimal_token_dtype(int64_t vocab_size);

std::string bin_path(const std::string& prefix);  // prefix + ".bin"
std::string idx_path(const std::string& prefix);  // prefix + ".idx"

// Megatron's IndexedDatasetBuilder. Writes `<prefix>.bin.tmp` as tokens come and, in finish(),
// `<prefix>.idx.tmp`; then renames both into place, so a reader never sees a half-written pair.
// Destroyed without finish(), it removes its temporary files.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(std::string prefix, DType dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // One sequence of the current document.
  void add_sequence(const int32_t* tokens, size_t count);
  void add_sequence(const int64_t* tokens, size_t count);
  // Closes the current document (it may hold no sequence).
  void end_document();
  // A document of one sequence (none if `count` is 0): add_sequence + end_document.
  void add_document(const std::vector<int32_t>& tokens);
  // Writes the index and renames both files into place.
  void finish();

  int64_t num_sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t num_documents() const { return static_cast<int64_t>(doc_index_.size()) - 1; }
  int64_t num_tokens() const { return tokens_; }

 private:
  template <typename T>
  void add(const T* tokens, size_t count);
  void flush();

  std::string prefix_;
  DType dtype_;
  std::FILE* bin_ = nullptr;
  std::string buffer_;  // encoded tokens not yet written
  std::vector<int32_t> lengths_;
  std::vector<int64_t> doc_index_{0};
  int64_t tokens_ = 0;
  bool finished_ = false;
};

// Megatron's IndexedDataset (mmap reader). Both files are mapped read-only; the index is
// checked once when opened, in O(sequences) (header, counts against the file size with
// overflow-checked arithmetic, monotone document indices ending at S, the sequences back to
// back from byte 0 as Megatron writes them, and .bin exactly as long as they are: an aliased
// pointer, a dtype code of another width or an index of another corpus is refused), so reads
// afterwards need no checks beyond their arguments. Nothing is allocated from a count the
// files give. A valid index may have trailing bytes (a multimodal file's sequence modes).
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);
  // The same over memory the caller keeps alive (the fuzzer, tests); `prefix` names it in errors.
  IndexedDataset(std::string prefix, const unsigned char* idx, size_t idx_size,
                 const unsigned char* bin, size_t bin_size);
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  DType dtype() const { return dtype_; }
  int64_t num_sequences() const { return num_sequences_; }
  int64_t num_documents() const { return num_doc_entries_ - 1; }
  int64_t num_tokens() const { return num_tokens_; }

  int32_t sequence_length(int64_t i) const;
  int64_t sequence_pointer(int64_t i) const;
  int64_t document_index(int64_t d) const;  // d in [0, num_documents()]

  // Tokens [offset, offset + count) of sequence `seq`, widened to int64, into out[0..count).
  void read(int64_t seq, int64_t offset, int64_t count, int64_t* out) const;
  std::vector<int64_t> sequence(int64_t seq) const;

  // Throws a DataError naming the first token outside [0, vocab_size) by document, sequence,
  // token and byte of .bin, with its id: a model's embedding would otherwise fail on it in the
  // middle of training with no word of the file. One pass over .bin, skipped when the dtype
  // holds no such value (uint16 tokens and a vocabulary of exactly 65536). First, a dtype too
  // narrow for the vocabulary (uint8 for GPT-2's 50257 ids, uint16 for more than 65536) is
  // refused at the .idx's dtype byte: the code is not the one the file was written with.
  void check_token_ids(int64_t vocab_size) const;

  // The size an index's header says the whole index has (header and the three arrays), or 0
  // when `size` is shorter than the header or the counts overflow 64 bits.
  static uint64_t index_size(const unsigned char* idx, size_t size);

 private:
  void check_index();

  // A read-only mapping of a whole file, unmapped when destroyed; or borrowed memory.
  struct Mapping {
    explicit Mapping(const std::string& path);
    Mapping(const unsigned char* d, size_t n) : data(d), size(n) {}
    ~Mapping();
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    const unsigned char* data = nullptr;  // null for an empty file
    size_t size = 0;
    bool owned = false;  // mapped here: unmap when destroyed
  };

  std::string prefix_;
  Mapping idx_, bin_;
  DType dtype_ = DType::Int32;
  int64_t num_sequences_ = 0;
  int64_t num_doc_entries_ = 0;
  int64_t num_tokens_ = 0;
  const unsigned char* lengths_ = nullptr;    // int32[S], unaligned
  const unsigned char* pointers_ = nullptr;   // int64[S], unaligned
  const unsigned char* doc_index_ = nullptr;  // int64[D+1], unaligned
};

}  // namespace dscpp::data
