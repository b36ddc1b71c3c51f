// Fuzzes Megatron's index reader (IndexedDataset) and the GPT windows over what it accepts.
// An input is a .idx followed by its .bin: the split is where the header says the index ends
// (the whole input when that is past its end), so a seed is `cat x.idx x.bin`. Whatever the
// bytes, the reader must either accept them, and then every read it allows stays inside the
// input (ASan) with no undefined behaviour (UBSan), or throw a DataError; any other exception
// escapes and libFuzzer reports it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "dscpp/data/data_error.h"
#include "dscpp/data/gpt_dataset.h"
#include "dscpp/data/indexed_dataset.h"

namespace data = dscpp::data;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  uint64_t need = data::IndexedDataset::index_size(bytes, size);
  size_t split = need == 0 || need > size ? size : static_cast<size_t>(need);
  std::shared_ptr<const data::IndexedDataset> ds;
  try {
    ds = std::make_shared<const data::IndexedDataset>("fuzz", bytes, split, bytes + split,
                                                      size - split);
  } catch (const data::DataError&) {
    return 0;  // refused: what a bad file should get
  }
  // Accepted: every sequence and document is readable. The sums are consumed so that the
  // reads are not optimised away.
  volatile uint64_t sink = 0;  // unsigned: int64 tokens may sum past 2^63
  const int64_t seqs = std::min<int64_t>(ds->num_sequences(), 256);
  for (int64_t i = 0; i < seqs; ++i) {
    std::vector<int64_t> s = ds->sequence(i);
    for (int64_t v : s) sink = sink + static_cast<uint64_t>(v);
  }
  for (int64_t d = 0; d <= std::min<int64_t>(ds->num_documents(), 256); ++d)
    sink = sink + static_cast<uint64_t>(ds->document_index(d));
  for (int64_t vocab : {int64_t{1}, int64_t{256}, int64_t{50257}}) {
    try {
      ds->check_token_ids(vocab);
    } catch (const data::DataError&) {
    }
  }
  // GPT windows over it: the first few of two epochs.
  try {
    data::GPTDataset gpt(ds, data::GPTDatasetOptions{3, 7, true, 0});
    std::vector<int64_t> window(4);
    for (int64_t e = 0; e < 2; ++e) {
      data::EpochIndex epoch = gpt.epoch(e);
      for (int64_t k = 0; k < std::min<int64_t>(epoch.num_samples(), 64); ++k) {
        epoch.read_sample(k, window.data());
        sink = sink + static_cast<uint64_t>(window[0]);
      }
    }
  } catch (const data::DataError&) {  // fewer tokens than one window
  }
  return 0;
}
