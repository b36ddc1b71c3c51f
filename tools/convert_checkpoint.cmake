add_executable(convert_checkpoint ${CMAKE_CURRENT_LIST_DIR}/convert_checkpoint.cpp)
target_link_libraries(convert_checkpoint PRIVATE dscpp Boost::program_options dscpp_warnings)
install(TARGETS convert_checkpoint RUNTIME DESTINATION bin)
