# The GPU architectures a CUDA build compiles its kernels for: SCIATTN_CUDA_ARCHS, a CMake list
# such as "80;86;89;90a", becomes CMAKE_CUDA_ARCHITECTURES. Included by the top-level
# CMakeLists.txt when SCIATTN_WITH_CUDA is on; the functions are also run in script mode by
# tests/cmake/test_cuda_archs.cmake.
#
# Where the list comes from, first match wins:
#   1. SCIATTN_CUDA_ARCHS (cache variable, or the environment variable of that name, which the
#      Python package's build passes on);
#   2. CMAKE_CUDA_ARCHITECTURES given on the command line;
#   3. in the PyTorch extension's build, the TORCH_CUDA_ARCH_LIST environment variable, as
#      DeepSpeed and torch.utils.cpp_extension read it ("8.0;8.6;9.0", "8.0 8.6+PTX", names such as
#      Ampere or Hopper); 9.0 becomes 90a, the Hopper kernels' architecture;
#   4. 90a.
# Every entry is an architecture of compute capability 8.0 or newer (NN, NNa, NN-real or
# NN-virtual): the kernels use mma.sync bf16 and cp.async. Only sm_90a's code holds the warpgroup
# (wgmma) kernels; the other architectures run the mma.sync kernels (the "portable" path).

# Sets <out> to the CMake architecture list for TORCH_CUDA_ARCH_LIST's value `torch_list`; an entry
# below 8.0 is skipped with a warning (DeepSpeed users often list 7.0 or 7.5 for other
# extensions; those GPUs get a clear error at run time instead), anything unreadable is an error
# naming it.
function(sciattn_archs_from_torch_list torch_list out)
  string(REPLACE " " ";" entries "${torch_list}")
  set(result "")
  foreach(entry ${entries})
    if(entry STREQUAL "")
      continue()
    endif()
    set(ptx OFF)
    if(entry MATCHES "^(.*)\\+PTX$")
      set(entry "${CMAKE_MATCH_1}")
      set(ptx ON)
    endif()
    # The architecture names torch accepts that sciattn can compile for.
    if(entry STREQUAL "Ampere")
      set(numbers "8.0;8.6")
    elseif(entry STREQUAL "Ada")
      set(numbers "8.9")
    elseif(entry STREQUAL "Hopper")
      set(numbers "9.0")
    elseif(entry MATCHES "^[0-9]+\\.[0-9]+a?$")
      set(numbers "${entry}")
    elseif(entry MATCHES "^(Kepler|Maxwell|Pascal|Volta|Turing)")
      message(WARNING "sciattn: TORCH_CUDA_ARCH_LIST entry '${entry}' is older than compute "
                      "capability 8.0, which sciattn's kernels need; skipped")
      continue()
    else()
      message(FATAL_ERROR "sciattn: cannot read TORCH_CUDA_ARCH_LIST entry '${entry}' (of "
                          "'${torch_list}'): expected compute capabilities such as 8.0, 8.6, 8.9 "
                          "or 9.0, optionally with +PTX, or Ampere, Ada, Hopper")
    endif()
    foreach(number ${numbers})
      string(REGEX REPLACE "^([0-9]+)\\.([0-9]+)(a?)$" "\\1;\\2;\\3" parts "${number}")
      list(GET parts 0 major)
      list(GET parts 1 minor)
      if(major LESS 8)
        message(WARNING "sciattn: TORCH_CUDA_ARCH_LIST entry '${number}' is older than compute "
                        "capability 8.0, which sciattn's kernels need; skipped")
        continue()
      endif()
      set(arch "${major}${minor}")
      if(arch STREQUAL "90")
        set(arch "90a")  # the warpgroup kernels need sm_90a; its code runs on every 9.0 GPU
      endif()
      if(ptx)
        list(APPEND result "${arch}")  # code and PTX
      else()
        list(APPEND result "${arch}-real")
      endif()
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES result)
  if(result STREQUAL "")
    message(FATAL_ERROR "sciattn: TORCH_CUDA_ARCH_LIST '${torch_list}' lists no architecture of "
                        "compute capability 8.0 or newer; sciattn's kernels need one (8.0, 8.6, "
                        "8.9 or 9.0)")
  endif()
  set(${out} "${result}" PARENT_SCOPE)
endfunction()

# Stops with a message naming the entry unless every entry of `archs` is an architecture sciattn
# compiles for.
function(sciattn_check_cuda_archs archs what)
  if(archs STREQUAL "")
    message(FATAL_ERROR "sciattn: ${what} is empty; give architectures such as \"80;86;89;90a\"")
  endif()
  foreach(arch ${archs})
    if(NOT arch MATCHES "^([0-9]+)(a?)(-real|-virtual)?$")
      message(FATAL_ERROR "sciattn: ${what} entry '${arch}' is not an architecture; expected "
                          "entries such as 80, 86, 89 or 90a (optionally -real or -virtual)")
    endif()
    if(CMAKE_MATCH_1 LESS 80)
      message(FATAL_ERROR "sciattn: ${what} entry '${arch}' is older than sm_80; sciattn's "
                          "kernels need compute capability 8.0 or newer (80, 86, 89, 90a)")
    endif()
    if(CMAKE_MATCH_1 STREQUAL "90" AND NOT CMAKE_MATCH_2 STREQUAL "a")
      message(WARNING "sciattn: ${what} entry '${arch}' compiles only the portable mma.sync "
                      "kernels for Hopper; 90a adds the warpgroup (wgmma) kernels, which are "
                      "faster")
    endif()
  endforeach()
endfunction()

# Sets <out> to 1 when `archs` holds sm_90a code (the warpgroup kernels), else 0.
function(sciattn_archs_have_wgmma archs out)
  set(result 0)
  foreach(arch ${archs})
    if(arch MATCHES "^90a(-real|-virtual)?$")
      set(result 1)
    endif()
  endforeach()
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# The build's list (see the top of this file) into CMAKE_CUDA_ARCHITECTURES and
# SCIATTN_CUDA_ARCHS_RESOLVED (the list the generated header and the messages show).
function(sciattn_resolve_cuda_archs)
  if(NOT SCIATTN_CUDA_ARCHS STREQUAL "")
    set(archs "${SCIATTN_CUDA_ARCHS}")
    set(what "SCIATTN_CUDA_ARCHS")
  elseif(NOT "$ENV{SCIATTN_CUDA_ARCHS}" STREQUAL "")
    set(archs "$ENV{SCIATTN_CUDA_ARCHS}")
    set(what "the SCIATTN_CUDA_ARCHS environment variable")
  elseif(DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT CMAKE_CUDA_ARCHITECTURES STREQUAL "")
    set(archs "${CMAKE_CUDA_ARCHITECTURES}")
    set(what "CMAKE_CUDA_ARCHITECTURES")
  elseif(SCIATTN_WITH_TORCH AND NOT "$ENV{TORCH_CUDA_ARCH_LIST}" STREQUAL "")
    sciattn_archs_from_torch_list("$ENV{TORCH_CUDA_ARCH_LIST}" archs)
    set(what "TORCH_CUDA_ARCH_LIST ($ENV{TORCH_CUDA_ARCH_LIST})")
  else()
    set(archs "90a")
    set(what "the default")
  endif()
  string(REPLACE " " ";" archs "${archs}")
  sciattn_check_cuda_archs("${archs}" "${what}")
  message(STATUS "sciattn: CUDA architectures ${archs} (from ${what})")
  set(CMAKE_CUDA_ARCHITECTURES "${archs}" PARENT_SCOPE)
  set(SCIATTN_CUDA_ARCHS_RESOLVED "${archs}" PARENT_SCOPE)
endfunction()
