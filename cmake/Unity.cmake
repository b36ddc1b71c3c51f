# Unity builds: DSCPP_UNITY_BUILD=ON compiles each target's units in batches of 16, one
# compiler run a batch. Parsing headers is most of a unit's time even with the precompiled
# header (g++ reads its whole image into every run: cmake/Precompiled.cmake), so a batch
# compiles in about a third of its units' time apart. scripts/test.sh's g++ build turns it on;
# every other build compiles each unit alone, so that a unit that misses an include of its own
# still fails there. In a batch the units of one target share one scope: their file-local names
# (anonymous namespaces, `static` functions) must differ across the target's files.
option(DSCPP_UNITY_BUILD "Compile each target's units in batches (unity build)" OFF)
if(DSCPP_UNITY_BUILD)
  set(CMAKE_UNITY_BUILD ON)
  set(CMAKE_UNITY_BUILD_BATCH_SIZE 16)
endif()

# True when the unit `src` defines or undefines a macro before its first include (NDEBUG, to
# read LibTorch's headers as LibTorch's own code does): it must parse those headers itself.
function(dscpp_defines_before_includes src out)
  set(found FALSE)
  if(EXISTS ${src} AND src MATCHES "\\.(cpp|cc)$")
    file(STRINGS ${src} directives REGEX "^#(define|undef|include)" LIMIT_COUNT 1)
    if(directives MATCHES "^#(define|undef)")
      set(found TRUE)
    endif()
  endif()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

# Keeps out of the batches of every target under `dir` the units that define a macro before
# their includes: in a batch the headers come in with the units before them, and the macro
# would reach the units after them. A target left with fewer than two units to batch (most
# test executables) is built without batches: one unit gains nothing, and g++ would take the
# unit for a header included by the batch's file (-Wsubobject-linkage on a test fixture in an
# anonymous namespace).
function(dscpp_unity_exclusions dir)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t IN LISTS targets)
    get_target_property(unity ${t} UNITY_BUILD)
    if(NOT unity)
      continue()
    endif()
    get_target_property(sources ${t} SOURCES)
    get_target_property(source_dir ${t} SOURCE_DIR)
    set(batched 0)
    foreach(src IN LISTS sources)
      # Generator expressions ($<TARGET_OBJECTS:...>, a variant's choice) are left as they are.
      if(src MATCHES "\\$<" OR NOT src MATCHES "\\.(cpp|cc|cxx)$")
        continue()
      endif()
      cmake_path(ABSOLUTE_PATH src BASE_DIRECTORY ${source_dir})
      dscpp_defines_before_includes(${src} defines_first)
      if(defines_first)
        set_source_files_properties(${src} TARGET_DIRECTORY ${t}
                                    PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
        continue()
      endif()
      # CMake compiles a unit with flags of its own alone.
      set(own "")
      foreach(property SKIP_UNITY_BUILD_INCLUSION COMPILE_OPTIONS COMPILE_DEFINITIONS
                       COMPILE_FLAGS INCLUDE_DIRECTORIES)
        get_source_file_property(value ${src} TARGET_DIRECTORY ${t} ${property})
        if(value)
          set(own TRUE)
        endif()
      endforeach()
      if(NOT own)
        math(EXPR batched "${batched} + 1")
      endif()
    endforeach()
    if(batched LESS 2)
      set_target_properties(${t} PROPERTIES UNITY_BUILD OFF)
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(sub IN LISTS subdirs)
    dscpp_unity_exclusions(${sub})
  endforeach()
endfunction()
