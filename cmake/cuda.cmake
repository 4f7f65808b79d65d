# Finds what the CUDA backend needs: nvcc (the CUDA language), the toolkit (cudart, cuBLAS,
# cuBLASLt) and NCCL (nccl.h and libnccl, in the toolkit's folders or on the usual paths). Sets
# PTDP_HAVE_CUDA ON when all are there; with PTDP_CUDA=ON a missing piece is an error.
include(CheckLanguage)
check_language(CUDA)
find_package(CUDAToolkit QUIET)
find_path(PTDP_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME
          PATH_SUFFIXES include)
find_library(PTDP_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME
             PATH_SUFFIXES lib lib64)

set(_missing "")
if(NOT CMAKE_CUDA_COMPILER)
  list(APPEND _missing "nvcc")
endif()
if(NOT CUDAToolkit_FOUND)
  list(APPEND _missing "the CUDA toolkit")
endif()
if(NOT PTDP_NCCL_INCLUDE OR NOT PTDP_NCCL_LIBRARY)
  list(APPEND _missing "NCCL (nccl.h, libnccl)")
endif()

if(_missing)
  if(PTDP_CUDA STREQUAL "ON")
    message(FATAL_ERROR "PTDP_CUDA=ON but not found: ${_missing}")
  endif()
  message(STATUS "ptdp: CUDA backend not built (not found: ${_missing})")
else()
  # A100 (sm_80) and H100/H200 (sm_90); override with -DCMAKE_CUDA_ARCHITECTURES=...
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  # One CUDA runtime, the shared libcudart that CUDA::cudart names, rather than CMake's default
  # static one beside it on every link line.
  set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
  enable_language(CUDA)
  # C++17 for the .cu files: CMake 3.25 (Debian 12) has no -std=c++20 flag for nvcc ("CUDA20"
  # is unknown to it), and the kernels need nothing newer. The host .cc files stay C++20.
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  add_library(PTDP::nccl UNKNOWN IMPORTED)
  set_target_properties(PTDP::nccl PROPERTIES IMPORTED_LOCATION ${PTDP_NCCL_LIBRARY}
                                              INTERFACE_INCLUDE_DIRECTORIES ${PTDP_NCCL_INCLUDE})
  set(PTDP_HAVE_CUDA ON)
  # Where runtime/cuda generates the CUDA module's interface fingerprint (cmake/cuda_abi.cmake).
  set(PTDP_CUDA_ABI_DIR ${CMAKE_BINARY_DIR}/generated)
  message(STATUS "ptdp: CUDA backend built (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                 "architectures ${CMAKE_CUDA_ARCHITECTURES}, NCCL ${PTDP_NCCL_LIBRARY})")
endif()
