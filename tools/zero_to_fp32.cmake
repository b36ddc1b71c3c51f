add_executable(zero_to_fp32 ${CMAKE_CURRENT_LIST_DIR}/zero_to_fp32.cpp)
target_link_libraries(zero_to_fp32 PRIVATE dscpp Boost::program_options dscpp_warnings)
install(TARGETS zero_to_fp32 RUNTIME DESTINATION bin)
