add_executable(to_universal ${CMAKE_CURRENT_LIST_DIR}/to_universal.cpp)
target_link_libraries(to_universal PRIVATE dscpp Boost::program_options dscpp_warnings)
install(TARGETS to_universal RUNTIME DESTINATION bin)
