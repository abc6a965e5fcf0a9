# The interface targets of tide, shared by the installed tideConfig.cmake and the top-level
# CMakeLists.txt (add_subdirectory, FetchContent). Expects TIDE_INCLUDE_DIR.
#   tide::tide  header-only, C++20, threads (and liburing, when pkg-config finds it)
#   tide::compiled  tide's library (separate compilation), where the install has it, with the
#               macros it was built with (TIDE_LIBRARY, TIDE_BUILT_WITH_LIBURING: tideConfig.cmake)
#   tide::cuda  tide::tide + the CUDA runtime, CCCL's include folder and, when found, NCCL
#               (defined when the consumer's CUDAToolkit is found)
#   tide::json  tide::tide + nlohmann/json, for <tide/io/json.hpp> (defined when the consumer's
#               nlohmann_json package is found)
include_guard(GLOBAL)

find_package(Threads REQUIRED)
# liburing, when found, gives spill files their io_uring path (otherwise pread/pwrite).
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(TIDE_LIBURING QUIET IMPORTED_TARGET liburing)
endif()
if(NOT TARGET tide::tide)
  add_library(tide::tide INTERFACE IMPORTED GLOBAL)
  set(_tide_libs Threads::Threads)
  set(_tide_defs "")
  if(TIDE_LIBURING_FOUND)
    list(APPEND _tide_libs PkgConfig::TIDE_LIBURING)
    set(_tide_defs "TIDE_HAVE_LIBURING=1")
  endif()
  set_target_properties(tide::tide PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${TIDE_INCLUDE_DIR}"
    INTERFACE_COMPILE_FEATURES cxx_std_20
    INTERFACE_COMPILE_DEFINITIONS "${_tide_defs}"
    INTERFACE_LINK_LIBRARIES "${_tide_libs}")
endif()

# tide::compiled: tide's library as the installing build made it (TIDE_LIBRARY and
# TIDE_BUILT_WITH_LIBURING, from tideConfig.cmake), with TIDE_SEPARATE_COMPILATION and the
# library's own feature macros, so that consumer and library agree.
if(TIDE_LIBRARY AND NOT TARGET tide::compiled)
  add_library(tide::compiled STATIC IMPORTED GLOBAL)
  set(_tide_libs Threads::Threads)
  set(_tide_defs TIDE_SEPARATE_COMPILATION)
  if(TIDE_BUILT_WITH_LIBURING)
    if(NOT TIDE_LIBURING_FOUND)
      message(FATAL_ERROR "tide: this install's libtide.a was built with liburing (TIDE_HAVE_LIBURING=1), but pkg-config "
                          "finds no liburing here: install it (Debian: liburing-dev), or link tide::tide (header-only)")
    endif()
    list(APPEND _tide_libs PkgConfig::TIDE_LIBURING)
    list(APPEND _tide_defs TIDE_HAVE_LIBURING=1)
  endif()
  set_target_properties(tide::compiled PROPERTIES
    IMPORTED_LOCATION "${TIDE_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${TIDE_INCLUDE_DIR}"
    INTERFACE_COMPILE_FEATURES cxx_std_20
    INTERFACE_COMPILE_DEFINITIONS "${_tide_defs}"
    INTERFACE_LINK_LIBRARIES "${_tide_libs}")
endif()
unset(_tide_libs)
unset(_tide_defs)

find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND AND NOT TARGET tide::cuda)
  # CUDA 13 keeps CCCL (libcu++, CUB, Thrust) under include/cccl.
  set(_tide_cccl "")
  foreach(_tide_dir IN LISTS CUDAToolkit_INCLUDE_DIRS)
    if(EXISTS "${_tide_dir}/cccl/cuda/stream_ref")
      list(APPEND _tide_cccl "${_tide_dir}/cccl")
    endif()
  endforeach()
  find_library(TIDE_NCCL_LIBRARY nccl HINTS "${CUDAToolkit_LIBRARY_DIR}")
  find_path(TIDE_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  add_library(tide::cuda INTERFACE IMPORTED GLOBAL)
  set(_tide_cuda_libs tide::tide CUDA::cudart)
  set(_tide_has_nccl 0)
  if(TIDE_NCCL_LIBRARY AND TIDE_NCCL_INCLUDE_DIR)
    list(APPEND _tide_cuda_libs "${TIDE_NCCL_LIBRARY}")
    set(_tide_has_nccl 1)
  endif()
  set_target_properties(tide::cuda PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${_tide_cccl}"
    INTERFACE_COMPILE_DEFINITIONS "TIDE_HAS_NCCL=${_tide_has_nccl}"
    INTERFACE_LINK_LIBRARIES "${_tide_cuda_libs}")
  unset(_tide_cccl)
  unset(_tide_cuda_libs)
  unset(_tide_has_nccl)
endif()

find_package(nlohmann_json 3.10 QUIET)
if(nlohmann_json_FOUND AND NOT TARGET tide::json)
  add_library(tide::json INTERFACE IMPORTED GLOBAL)
  set_target_properties(tide::json PROPERTIES INTERFACE_LINK_LIBRARIES "tide::tide;nlohmann_json::nlohmann_json")
endif()
