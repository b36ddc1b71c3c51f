# One precompiled header for every C++ target that uses LibTorch. Parsing LibTorch's headers
# is most of a unit's compile time (a zero/ unit: 12.2 s with clang++ at -O0, 3.4 s with the
# header precompiled; docs/perf-log/2026-12-06.md), so the header is compiled once
# (dscpp_pch) and every other such target reuses it. Reuse needs the same code-generation
# flags in every unit, hence -fPIC everywhere (see the top-level CMakeLists.txt).
# DSCPP_PCH=OFF compiles every unit from its own includes.
option(DSCPP_PCH "Precompile LibTorch's headers once for every target that uses them" ON)

# True when `target` links dscpp_torch, directly or through other targets of this project.
function(dscpp_uses_torch target out)
  set(todo ${target})
  set(seen "")
  set(found FALSE)
  while(todo AND NOT found)
    list(POP_FRONT todo t)
    if(t IN_LIST seen OR NOT TARGET ${t})
      continue()
    endif()
    list(APPEND seen ${t})
    if(t STREQUAL "dscpp_torch")
      set(found TRUE)
      break()
    endif()
    get_target_property(type ${t} TYPE)
    set(libs "")
    if(NOT type STREQUAL "INTERFACE_LIBRARY")
      get_target_property(direct ${t} LINK_LIBRARIES)
      if(direct)
        list(APPEND libs ${direct})
      endif()
    endif()
    get_target_property(iface ${t} INTERFACE_LINK_LIBRARIES)
    if(iface)
      list(APPEND libs ${iface})
    endif()
    foreach(lib IN LISTS libs)
      # $<BUILD_INTERFACE:x> and the like: look at x.
      string(REGEX REPLACE "^\\$<[A-Z_]+:(.*)>$" "\\1" lib "${lib}")
      string(REGEX REPLACE "^.*::" "" bare "${lib}")
      if(TARGET ${lib})
        list(APPEND todo ${lib})
      elseif(TARGET ${bare})
        list(APPEND todo ${bare})
      endif()
    endforeach()
  endwhile()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

# Makes every LibTorch target under `dir` reuse dscpp_pch. Units with flags of their own
# (optimisation levels, instruction sets, generated code) and sanitized targets (the fuzzers)
# compile from their own includes: a precompiled header must match their flags.
function(dscpp_reuse_pch dir)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t IN LISTS targets)
    get_target_property(type ${t} TYPE)
    if(t STREQUAL "dscpp_pch" OR NOT type MATCHES "^(STATIC_LIBRARY|SHARED_LIBRARY|MODULE_LIBRARY|OBJECT_LIBRARY|EXECUTABLE)$")
      continue()
    endif()
    get_target_property(options ${t} COMPILE_OPTIONS)
    if(options AND "${options}" MATCHES "sanitize")
      continue()
    endif()
    dscpp_uses_torch(${t} uses)
    if(NOT uses)
      continue()
    endif()
    target_precompile_headers(${t} REUSE_FROM dscpp_pch)
    get_target_property(sources ${t} SOURCES)
    get_target_property(source_dir ${t} SOURCE_DIR)
    foreach(src IN LISTS sources)
      # Relative names are the target's folder's; looked up from here they would not be.
      cmake_path(ABSOLUTE_PATH src BASE_DIRECTORY ${source_dir})
      get_source_file_property(own ${src} TARGET_DIRECTORY ${t} COMPILE_OPTIONS)
      get_source_file_property(flags ${src} TARGET_DIRECTORY ${t} COMPILE_FLAGS)
      # A unit that defines a macro before its first include (NDEBUG, to read LibTorch's
      # headers as LibTorch's own code does) must parse them itself: the precompiled header
      # was parsed without it.
      dscpp_defines_before_includes(${src} defines_first)  # cmake/Unity.cmake
      if(own OR flags OR defines_first)
        set_source_files_properties(${src} TARGET_DIRECTORY ${t}
                                    PROPERTIES SKIP_PRECOMPILE_HEADERS ON)
      endif()
    endforeach()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    dscpp_reuse_pch(${sub})
  endforeach()
endfunction()

function(dscpp_add_pch)
  if(NOT DSCPP_PCH)
    return()
  endif()
  add_library(dscpp_pch STATIC ${PROJECT_SOURCE_DIR}/cmake/pch.cpp)
  target_link_libraries(dscpp_pch PRIVATE dscpp_torch nlohmann_json::nlohmann_json
                                          fmt::fmt-header-only)
  # g++ reads its whole precompiled image into each unit (700 MB for <torch/torch.h>: 10.9 s a
  # unit against 14.2 s without; 4.3 s with <ATen/ATen.h> alone), clang++ only what a unit
  # uses: g++ gets the headers most units include, clang++ all of LibTorch's.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    set(headers <ATen/ATen.h>)
  else()
    set(headers <torch/torch.h>)
  endif()
  target_precompile_headers(dscpp_pch PRIVATE ${headers} <nlohmann/json.hpp> <fmt/format.h>)
  # The header is compiled afresh, never taken from ccache: a cached one made in another
  # checkout names that checkout's LibTorch headers, which a unit here would include a second
  # time from its own. ccache still serves the units, keyed on this header's bytes; with no
  # timestamp written into it, a rebuilt header keeps them.
  set_target_properties(dscpp_pch PROPERTIES CXX_COMPILER_LAUNCHER "")
  target_compile_options(dscpp_pch PRIVATE
                         $<$<CXX_COMPILER_ID:Clang>:SHELL:-Xclang -fno-pch-timestamp>)
  dscpp_reuse_pch(${PROJECT_SOURCE_DIR})
endfunction()
