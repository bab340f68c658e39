# Finds NCCL for the trainer's multi-GPU communicator (src/train/cuda/nccl_communicator.cu).
# SCIATTN_WITH_NCCL: AUTO (default: used when found), ON (not found is an error), OFF. Looked for
# in NCCL_ROOT (CMake variable or environment; its include/ and lib/, or a pip wheel's layout
# nvidia/nccl/{include,lib}), in the Python interpreter's nvidia-nccl-cu13 / -cu12 package
# (site-packages/nvidia/nccl), and in the system's folders (Debian's libnccl-dev).
# Gives SCIATTN_NCCL_FOUND and, when found, the imported target sciattn::nccl (linked dynamically:
# libnccl.so.2, found at run time through the build's RPATH or LD_LIBRARY_PATH).
set(SCIATTN_NCCL_FOUND OFF)
if(SCIATTN_WITH_NCCL STREQUAL "OFF" OR NOT SCIATTN_WITH_CUDA)
  if(SCIATTN_WITH_NCCL STREQUAL "ON" AND NOT SCIATTN_WITH_CUDA)
    message(FATAL_ERROR "SCIATTN_WITH_NCCL=ON needs a CUDA build (SCIATTN_WITH_CUDA=ON, the cuda "
                        "or gpu preset)")
  endif()
  return()
endif()

set(sciattn_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME})
find_package(Python3 COMPONENTS Interpreter QUIET)
if(Python3_Interpreter_FOUND)
  # The folder of the pip wheel's nvidia/nccl namespace package, when one is installed.
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
      "import importlib.util as u; s = u.find_spec('nvidia.nccl'); print(list(s.submodule_search_locations)[0] if s else '')"
    OUTPUT_VARIABLE sciattn_nccl_pip OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(sciattn_nccl_pip)
    list(APPEND sciattn_nccl_hints ${sciattn_nccl_pip})
  endif()
endif()
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${sciattn_nccl_hints}
          PATH_SUFFIXES include nvidia/nccl/include)
# The library beside the header first (a wheel ships libnccl.so.2 without the libnccl.so link), so
# that a header and a library from two installations are not mixed.
if(NCCL_INCLUDE_DIR)
  get_filename_component(sciattn_nccl_beside ${NCCL_INCLUDE_DIR} DIRECTORY)
  list(PREPEND sciattn_nccl_hints ${sciattn_nccl_beside})
endif()
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${sciattn_nccl_hints}
             PATH_SUFFIXES lib lib64 nvidia/nccl/lib)

if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
  file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h sciattn_nccl_version REGEX "#define NCCL_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*NCCL_MINOR ([0-9]+).*NCCL_PATCH ([0-9]+).*"
         "\\1.\\2.\\3" sciattn_nccl_version "${sciattn_nccl_version}")
  # ncclGetLastError (2.13) is the newest call the communicator uses.
  if(sciattn_nccl_version VERSION_LESS 2.13)
    set(sciattn_nccl_problem "NCCL ${sciattn_nccl_version} in ${NCCL_INCLUDE_DIR} is older than 2.13")
  else()
    set(SCIATTN_NCCL_FOUND ON)
  endif()
else()
  set(sciattn_nccl_problem "NCCL not found (nccl.h: ${NCCL_INCLUDE_DIR}, library: ${NCCL_LIBRARY})")
endif()

if(SCIATTN_NCCL_FOUND)
  message(STATUS "sciattn: NCCL ${sciattn_nccl_version} (${NCCL_LIBRARY}): the multi-GPU trainer is built")
  add_library(sciattn::nccl SHARED IMPORTED)
  set_target_properties(sciattn::nccl PROPERTIES IMPORTED_LOCATION ${NCCL_LIBRARY}
                        INTERFACE_INCLUDE_DIRECTORIES ${NCCL_INCLUDE_DIR})
elseif(SCIATTN_WITH_NCCL STREQUAL "ON")
  message(FATAL_ERROR "SCIATTN_WITH_NCCL=ON: ${sciattn_nccl_problem}. pip install "
    "nvidia-nccl-cu13 (CMake asks this Python for site-packages/nvidia/nccl), or point "
    "-DNCCL_ROOT at a folder with include/nccl.h and lib/libnccl.so*; or -DSCIATTN_WITH_NCCL=AUTO")
else()
  message(STATUS "sciattn: ${sciattn_nccl_problem}, so the trainer has no multi-GPU communicator "
                 "(pip install nvidia-nccl-cu13, or -DNCCL_ROOT=...)")
endif()
