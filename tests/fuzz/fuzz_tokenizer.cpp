// Fuzzes GPT2Tokenizer's readers of encoder.json and vocab.bpe, then the tokenizer they build.
// An input is the vocabulary's JSON, a NUL byte, then the merges file (no NUL: all vocabulary,
// no merges). The files must be accepted or refused with a DataError (any other exception
// escapes and libFuzzer reports it); an accepted tokenizer encodes the merges text to ids of its
// vocabulary, which decode without error.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "dscpp/data/data_error.h"
#include "dscpp/data/gpt2_tokenizer.h"

namespace data = dscpp::data;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* bytes, size_t size) {
  std::string input(reinterpret_cast<const char*>(bytes), size);
  size_t nul = input.find('\0');
  std::string vocab = input.substr(0, nul);
  std::string merges = nul == std::string::npos ? "" : input.substr(nul + 1);
  std::optional<data::GPT2Tokenizer> t;
  try {
    t = data::GPT2Tokenizer::from_text(vocab, "fuzz.json", merges, "fuzz.bpe");
  } catch (const data::DataError&) {
    return 0;  // refused: what a bad file should get
  }
  // Accepted: every id it encodes to is one of its tokens, so decoding never fails.
  std::string text = merges.substr(0, 4096) + " Hello, world! 123 'll \xff\xfe";
  std::vector<int32_t> ids = t->encode(text);
  for (int32_t id : ids)
    if (id < 0 || id >= t->id_bound()) std::abort();
  (void)t->decode(ids);
  return 0;
}
