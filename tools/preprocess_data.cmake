# preprocess_data: text (JSON lines) to Megatron's indexed dataset with GPT-2's BPE.
add_executable(preprocess_data ${CMAKE_CURRENT_SOURCE_DIR}/preprocess_data.cpp)
target_link_libraries(preprocess_data PRIVATE stdc++ dscpp Boost::program_options dscpp_warnings)
# The tokenizer and the writer use no LibTorch: not loading it at start-up (libstdc++ first,
# or libtorch_cpu, which exports some of its symbols, would be needed) saves a second a run.
target_link_options(preprocess_data PRIVATE LINKER:--as-needed)
# JSON parsing and the pipeline are ours to run fast, also in the test suite's -O0 build.
set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/preprocess_data.cpp
  PROPERTIES COMPILE_OPTIONS $<$<CONFIG:Check>:-O2>)
install(TARGETS preprocess_data RUNTIME DESTINATION bin)
