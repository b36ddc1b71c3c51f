# fuzz_index: Megatron's .idx/.bin reader and the GPT windows, built from data/'s sources
# without LibTorch. Seeds in corpus/index/ (.idx then .bin, made by
# tests/data/make_fuzz_seeds.py from the independent numpy writer).
dscpp_add_fuzzer(index
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_index.cpp
          ${PROJECT_SOURCE_DIR}/data/input_file.cpp
          ${PROJECT_SOURCE_DIR}/data/indexed_dataset.cpp
          ${PROJECT_SOURCE_DIR}/data/gpt_dataset.cpp
  LAYERS data)
