# fuzz_tokenizer: GPT-2's encoder.json / vocab.bpe readers and the BPE they build, from data/'s
# sources without LibTorch. Seeds in corpus/tokenizer/ (vocabulary JSON, NUL, merges), made by
# tests/data/make_fuzz_seeds.py.
dscpp_add_fuzzer(tokenizer
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_tokenizer.cpp
          ${PROJECT_SOURCE_DIR}/data/input_file.cpp
          ${PROJECT_SOURCE_DIR}/data/gpt2_tokenizer.cpp
          ${PROJECT_SOURCE_DIR}/data/unicode_classes.cpp
  LAYERS data
  LINK nlohmann_json::nlohmann_json)
