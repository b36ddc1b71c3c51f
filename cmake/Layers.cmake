# The layer table of docs/architecture.md as a build fact. Each folder is one static library,
# dscpp_<folder>, whose include root holds only that folder (as dscpp/<folder>), so a
# target sees the headers of the folders it links and no others: an include that runs
# back up the table does not compile. tests/layering/check_includes.py checks the table's
# exact rows (a folder may reach what its neighbours use only through them).
#
# dscpp_add_layer(<folder> [SOURCES ...] [USES <folders>...] [LINK <targets>...])
#   USES: the folders of the table's row (linked PUBLIC, so their headers reach our users).
#   LINK: outside libraries the folder's headers need (PUBLIC).
function(dscpp_add_layer folder)
  cmake_parse_arguments(L "" "" "SOURCES;USES;LINK" ${ARGN})
  set(target dscpp_${folder})
  set(root ${PROJECT_BINARY_DIR}/include/${folder})
  file(MAKE_DIRECTORY ${root}/dscpp)
  if(NOT EXISTS ${root}/dscpp/${folder})
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${folder} ${root}/dscpp/${folder} SYMBOLIC)
  endif()
  add_library(${target} STATIC ${L_SOURCES})
  add_library(dscpp::${target} ALIAS ${target})
  target_include_directories(${target} PUBLIC $<BUILD_INTERFACE:${root}>
                                              $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  foreach(use IN LISTS L_USES)
    target_link_libraries(${target} PUBLIC dscpp_${use})
  endforeach()
  target_link_libraries(${target} PUBLIC dscpp_base ${L_LINK}
                                  PRIVATE $<BUILD_INTERFACE:dscpp_warnings>)
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  set_property(GLOBAL APPEND PROPERTY DSCPP_LAYERS ${target})
endfunction()

# Layer 0: the headers at the root (dscpp/error.h, the base of every error we throw), which
# every layer may use. The umbrella header dscpp/dscpp.h belongs to the umbrella target.
function(dscpp_add_base)
  set(root ${PROJECT_BINARY_DIR}/include/base)
  file(MAKE_DIRECTORY ${root}/dscpp)
  if(NOT EXISTS ${root}/dscpp/error.h)
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/error.h ${root}/dscpp/error.h SYMBOLIC)
  endif()
  add_library(dscpp_base INTERFACE)
  target_include_directories(dscpp_base INTERFACE $<BUILD_INTERFACE:${root}>
                                                  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(dscpp_base INTERFACE fmt::fmt-header-only)
endfunction()

# The umbrella, dscpp::dscpp: every layer, and <dscpp/dscpp.h>.
function(dscpp_add_umbrella)
  set(root ${PROJECT_BINARY_DIR}/include/umbrella)
  file(MAKE_DIRECTORY ${root}/dscpp)
  if(NOT EXISTS ${root}/dscpp/dscpp.h)
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/dscpp.h ${root}/dscpp/dscpp.h SYMBOLIC)
  endif()
  get_property(layers GLOBAL PROPERTY DSCPP_LAYERS)
  add_library(dscpp INTERFACE)
  add_library(dscpp::dscpp ALIAS dscpp)
  target_include_directories(dscpp INTERFACE $<BUILD_INTERFACE:${root}>
                                             $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_link_libraries(dscpp INTERFACE ${layers})
endfunction()
