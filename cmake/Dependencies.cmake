# Finds the project's dependencies. LibTorch comes from PyTorch's PyPI package in the
# project's virtual environment; we make our own imported targets from its folders
# instead of using TorchConfig.cmake, which would drag CUDA into the CPU build.
find_package(nlohmann_json 3.10 REQUIRED)
find_package(fmt REQUIRED)
# Boost.Program_options: Debian's CMake package; or, where only a stray copy of the
# library exists (the GPU machines unpack Debian's .deb into a folder), its path.
if(DSCPP_BOOST_PO_LIBRARY)
  add_library(Boost::program_options UNKNOWN IMPORTED)
  set_target_properties(Boost::program_options PROPERTIES
    IMPORTED_LOCATION ${DSCPP_BOOST_PO_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${DSCPP_BOOST_PO_INCLUDE})
else()
  find_package(Boost 1.74 CONFIG REQUIRED COMPONENTS program_options)
endif()
find_package(Threads REQUIRED)
# yaml-cpp: model configs written as YAML (config/yaml_text.cpp). Debian's libyaml-cpp-dev (0.7;
# Ubuntu 24.04 has 0.8, which keeps the target name `yaml-cpp`). A GPU machine without it
# takes the two Debian packages carried in .gpu/ (scripts/gpu_rows.py unpacks them).
find_package(yaml-cpp CONFIG)
if(NOT yaml-cpp_FOUND)
  message(FATAL_ERROR "dscpp: yaml-cpp not found; apt-get install libyaml-cpp-dev (or carry "
    "libyaml-cpp-dev and libyaml-cpp0.7 .debs in .gpu/ on a GPU machine)")
endif()
# zlib: CRC-32 checks of checkpoint records (LibTorch's zip reader skips them).
find_package(ZLIB REQUIRED)

if(NOT DSCPP_PYTHON)
  if(EXISTS ${PROJECT_SOURCE_DIR}/.venv/bin/python3)
    set(DSCPP_PYTHON ${PROJECT_SOURCE_DIR}/.venv/bin/python3)
  else()
    find_program(DSCPP_PYTHON python3 REQUIRED)
  endif()
endif()
set(DSCPP_PYTHON ${DSCPP_PYTHON} CACHE FILEPATH "Python with torch (and deepspeed for tests)")

if(NOT DSCPP_TORCH_DIR)
  execute_process(
    COMMAND ${DSCPP_PYTHON} -c "import os, torch; print(os.path.dirname(torch.__file__))"
    OUTPUT_VARIABLE _torch_dir OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "dscpp: ${DSCPP_PYTHON} cannot import torch; run scripts/install.sh first")
  endif()
  set(DSCPP_TORCH_DIR ${_torch_dir} CACHE PATH "PyTorch's package folder (holds include/ and lib/)")
endif()
execute_process(
  COMMAND ${DSCPP_PYTHON} -c "import torch; print(torch.__version__.split('+')[0])"
  OUTPUT_VARIABLE DSCPP_TORCH_VERSION OUTPUT_STRIP_TRAILING_WHITESPACE)
message(STATUS "dscpp: LibTorch ${DSCPP_TORCH_VERSION} from ${DSCPP_TORCH_DIR}")

# ProcessGroupGloo.hpp includes gloo's headers, which the wheel does not ship: Debian's
# libgloo-dev provides them (headers only; the gloo code itself is inside libtorch_cpu).
find_path(DSCPP_GLOO_INCLUDE gloo/rendezvous/store.h REQUIRED)

add_library(dscpp_torch INTERFACE)
target_include_directories(dscpp_torch SYSTEM INTERFACE
  $<BUILD_INTERFACE:${DSCPP_TORCH_DIR}/include>
  $<BUILD_INTERFACE:${DSCPP_TORCH_DIR}/include/torch/csrc/api/include>
  $<BUILD_INTERFACE:${DSCPP_GLOO_INCLUDE}>)
target_compile_definitions(dscpp_torch INTERFACE USE_C10D_GLOO USE_DISTRIBUTED)
target_link_directories(dscpp_torch INTERFACE $<BUILD_INTERFACE:${DSCPP_TORCH_DIR}/lib>)
target_link_libraries(dscpp_torch INTERFACE torch_cpu c10 Threads::Threads)
target_link_options(dscpp_torch INTERFACE $<BUILD_INTERFACE:LINKER:-rpath,${DSCPP_TORCH_DIR}/lib>)

if(DSCPP_CUDA)
  # Our own kernels (ops/*.cu). nvcc's host compiler: g++ (g++ 12 here, g++ 13 from
  # /opt/gcc/bin on the GPU machines, first on PATH), whatever compiles the C++ code (clang++
  # here); the kernels' interface is plain C so the two need not match.
  if(NOT CMAKE_CUDA_HOST_COMPILER AND NOT DEFINED ENV{CUDAHOSTCXX})
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
      set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
    else()
      find_program(DSCPP_CUDA_HOST_CXX NAMES g++ g++-13 g++-12 REQUIRED)
      set(CMAKE_CUDA_HOST_COMPILER ${DSCPP_CUDA_HOST_CXX})
    endif()
  endif()
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90a)
  endif()
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  # LibTorch uses the shared CUDA runtime; a second, static one would not share its state.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  # NCCL: the copy torch itself loads (PyPI's nvidia-nccl, beside torch in site-packages)
  # first, so that one libnccl.so.2 serves c10d and us; the toolkit's copy otherwise.
  # That wheel ships only the versioned name, hence libnccl.so.2 among the names.
  get_filename_component(_site_packages ${DSCPP_TORCH_DIR} DIRECTORY)
  find_path(DSCPP_NCCL_INCLUDE nccl.h
    HINTS ${_site_packages}/nvidia/nccl/include ${CUDAToolkit_INCLUDE_DIRS} REQUIRED)
  find_library(DSCPP_NCCL_LIB NAMES nccl libnccl.so.2 NAMES_PER_DIR
    HINTS ${_site_packages}/nvidia/nccl/lib ${CUDAToolkit_LIBRARY_DIR}
          ${CUDAToolkit_LIBRARY_ROOT}/lib ${CUDAToolkit_LIBRARY_ROOT}/lib64 REQUIRED)
  message(STATUS "dscpp: NCCL ${DSCPP_NCCL_LIB}")
  # cuBLAS (ops/grouped_weight_grad: its grouped GEMM): likewise the copy torch loads, the
  # toolkit's where torch's wheels hold none.
  find_library(DSCPP_CUBLAS_LIB NAMES cublas libcublas.so.13 libcublas.so.12 NAMES_PER_DIR
    HINTS ${_site_packages}/nvidia/cu13/lib ${_site_packages}/nvidia/cublas/lib NO_DEFAULT_PATH)
  if(NOT DSCPP_CUBLAS_LIB)
    set(DSCPP_CUBLAS_LIB CUDA::cublas)
  endif()
  message(STATUS "dscpp: cuBLAS ${DSCPP_CUBLAS_LIB}")
  target_compile_definitions(dscpp_torch INTERFACE USE_C10D_NCCL USE_CUDA DSCPP_CUDA=1)
  target_include_directories(dscpp_torch SYSTEM INTERFACE $<BUILD_INTERFACE:${DSCPP_NCCL_INCLUDE}>)
  # --no-as-needed: libtorch_cuda registers CUDA kernels at load time, and nothing we
  # call may name one of its symbols directly.
  target_link_libraries(dscpp_torch INTERFACE -Wl,--no-as-needed torch_cuda c10_cuda
                        -Wl,--as-needed CUDA::cudart ${DSCPP_NCCL_LIB} ${DSCPP_CUBLAS_LIB})
endif()

# ---------------------------------------------------------------------------------------
# runtime/monitor: Protocol Buffers for TensorBoard event files. Debian's libprotobuf-dev and
# protobuf-compiler (3.21 on Debian 12 and on the GPU machines' Ubuntu 24.04). We link only
# the lite runtime; DSCPP_PROTOBUF_LITE_LIBRARY is its file, named in the exported package.
# CRC-32C: no package (Debian 12 has none); runtime/monitor/tfrecord.cpp has its own table.
find_package(Protobuf 3.12 REQUIRED)
set(DSCPP_PROTOC ${Protobuf_PROTOC_EXECUTABLE})
if(NOT DSCPP_PROTOC)
  message(FATAL_ERROR "dscpp: protoc not found; apt-get install protobuf-compiler")
endif()
if(Protobuf_LITE_LIBRARY_RELEASE)
  set(DSCPP_PROTOBUF_LITE_LIBRARY ${Protobuf_LITE_LIBRARY_RELEASE})
else()
  set(DSCPP_PROTOBUF_LITE_LIBRARY ${Protobuf_LITE_LIBRARY})
endif()
if(NOT TARGET protobuf::libprotobuf-lite OR NOT DSCPP_PROTOBUF_LITE_LIBRARY)
  message(FATAL_ERROR "dscpp: protobuf's lite library not found; apt-get install libprotobuf-dev")
endif()
message(STATUS "dscpp: protobuf ${Protobuf_VERSION}, ${DSCPP_PROTOBUF_LITE_LIBRARY}")
