# Finds the CBLAS the trainer's CPU matrix products run on (OpenBLAS from Debian:
# libopenblas-openmp-dev, the OpenMP build, so that its threads and ours share one pool).
# Sets SCIATTN_BLAS_FOUND and, when found, the imported target sciattn::blas.
#
# Overrides, for machines where the library lives elsewhere (a GPU machine that gets Debian's
# library carried along):
#   -DBLAS_LIBRARIES=/path/libopenblas.so (or .a)   the library itself; skips the search
#   -DCBLAS_INCLUDE_DIR=/path/with/cblas.h          the folder of cblas.h
#   -DCMAKE_PREFIX_PATH=/prefix                     searched first for both
set(SCIATTN_BLAS_FOUND OFF)
if(NOT BLAS_LIBRARIES)
  set(BLA_VENDOR OpenBLAS)
  find_package(BLAS QUIET)
endif()
find_path(CBLAS_INCLUDE_DIR cblas.h
  PATH_SUFFIXES openblas-openmp openblas-pthread openblas x86_64-linux-gnu/openblas-openmp
                x86_64-linux-gnu/openblas-pthread x86_64-linux-gnu
  DOC "folder of cblas.h (OpenBLAS)")
# What was given or found must exist: a wrong override is reported as "not found" (with the
# paths) rather than as a broken target later.
set(sciattn_blas_usable OFF)
if(BLAS_LIBRARIES AND CBLAS_INCLUDE_DIR AND EXISTS "${CBLAS_INCLUDE_DIR}/cblas.h")
  set(sciattn_blas_usable ON)
  foreach(lib IN LISTS BLAS_LIBRARIES)
    if(NOT lib MATCHES "^-" AND NOT EXISTS "${lib}")
      set(sciattn_blas_usable OFF)
    endif()
  endforeach()
endif()
if(sciattn_blas_usable)
  set(SCIATTN_BLAS_FOUND ON)
  if(NOT TARGET sciattn::blas)
    add_library(sciattn::blas INTERFACE IMPORTED)
    set_target_properties(sciattn::blas PROPERTIES
      INTERFACE_LINK_LIBRARIES "${BLAS_LIBRARIES}"
      INTERFACE_INCLUDE_DIRECTORIES "${CBLAS_INCLUDE_DIR}")
  endif()
endif()
