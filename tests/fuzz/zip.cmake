# The zip reader of torch files (runtime/checkpoint/zip_reader.h): no LibTorch needed.
dscpp_add_fuzzer(zip
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_zip.cpp
          ${PROJECT_SOURCE_DIR}/runtime/checkpoint/zip_reader.cpp
  LAYERS runtime
  LINK ZLIB::ZLIB)
