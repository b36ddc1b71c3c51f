# Installs libdscpp, its headers (as <dscpp/...>) and an exported CMake package, so that a
# user's project does find_package(dscpp) and links dscpp::dscpp.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

get_property(_layers GLOBAL PROPERTY DSCPP_LAYERS)
install(TARGETS dscpp dscpp_base ${_layers} dscpp_torch EXPORT dscppTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(FILES dscpp.h error.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dscpp)
foreach(dir config comm data ops nn optim model_zoo zero runtime pipe)
  if(EXISTS ${PROJECT_SOURCE_DIR}/${dir})
    install(DIRECTORY ${dir} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/dscpp
      FILES_MATCHING PATTERN "*.h")
  endif()
endforeach()

set(DSCPP_CONFIG_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/dscpp)
install(EXPORT dscppTargets NAMESPACE dscpp:: DESTINATION ${DSCPP_CONFIG_DIR})
configure_package_config_file(cmake/dscppConfig.cmake.in
  ${PROJECT_BINARY_DIR}/dscppConfig.cmake INSTALL_DESTINATION ${DSCPP_CONFIG_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/dscppConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/dscppConfig.cmake ${PROJECT_BINARY_DIR}/dscppConfigVersion.cmake
  DESTINATION ${DSCPP_CONFIG_DIR})
