# Locates torch for the PyTorch extension (SCIATTN_WITH_TORCH) and compiles everything of this
# build with torch's C++ ABI. Included by the top-level CMakeLists.txt before the library.
#
# The ABI matters for the library too, not only for the extension: the library's Status carries a
# std::string that the extension reads, and std::string's layout depends on
# _GLIBCXX_USE_CXX11_ABI, so a compiler whose default differs from torch's must not build the two
# halves differently.
#
# Torch is located by asking the Python interpreter (Python3_EXECUTABLE, which pip and
# scripts/build_torch_ext.sh pass) rather than with find_package(Torch): the PyPI wheels are CUDA
# builds, and TorchConfig.cmake insists on a CUDA toolkit even for a CPU-only extension.
find_package(Python3 REQUIRED COMPONENTS Interpreter)
execute_process(
  COMMAND ${Python3_EXECUTABLE} -c
    "import os, torch; print(os.path.dirname(torch.__file__)); print(int(torch.compiled_with_cxx11_abi())); print(torch.__version__)"
  OUTPUT_VARIABLE torch_query RESULT_VARIABLE torch_query_rc ERROR_VARIABLE torch_query_err
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT torch_query_rc EQUAL 0)
  # The interpreter's last line says why (usually "ModuleNotFoundError: No module named 'torch'").
  string(STRIP "${torch_query_err}" torch_query_err)
  string(REGEX REPLACE ".*\n" "" torch_query_reason "${torch_query_err}")
  if(SKBUILD)
    # pip's default build runs in an isolated environment that has the build requirements but not
    # torch; the extension must be compiled against the torch it will run with.
    set(torch_query_fix
      "pip builds sciattn in an isolated environment without torch unless told otherwise. Install "
      "torch into your environment first, then build without isolation:\n"
      "    pip install torch\n"
      "    pip install --no-build-isolation .\n"
      "or run scripts/setup.sh --python (a .venv with the pinned torch, then the package).")
  else()
    set(torch_query_fix
      "Install torch into that interpreter (pip install torch), or point Python3_EXECUTABLE at "
      "one that has it; scripts/setup.sh --python sets up a .venv with the pinned torch.")
  endif()
  message(FATAL_ERROR
    "sciattn: the PyTorch extension is compiled against the installed torch, but "
    "`${Python3_EXECUTABLE} -c 'import torch'` fails: ${torch_query_reason}\n" ${torch_query_fix})
endif()
string(REPLACE "\n" ";" torch_query "${torch_query}")
list(GET torch_query 0 SCIATTN_TORCH_DIR)
list(GET torch_query 1 SCIATTN_TORCH_CXX11_ABI)
list(GET torch_query 2 SCIATTN_TORCH_VERSION)
message(STATUS "sciattn: torch ${SCIATTN_TORCH_VERSION} at ${SCIATTN_TORCH_DIR}")

add_compile_definitions(_GLIBCXX_USE_CXX11_ABI=${SCIATTN_TORCH_CXX11_ABI})

# The C++ standard the extension is compiled with follows what torch's headers require: ATen.h
# stops with "#error C++<NN> or later compatible compiler is required to use ATen." (C++20 for
# torch 2.15; C++17 where the line names 17 or is absent). The library itself stays C++17; its
# public headers compile as either.
set(SCIATTN_TORCH_CXX_STANDARD 17)
file(STRINGS "${SCIATTN_TORCH_DIR}/include/ATen/ATen.h" torch_std_line
     REGEX "C\\+\\+[0-9]+ or later compatible compiler is required")
if(torch_std_line MATCHES "C\\+\\+([0-9]+) or later")
  set(SCIATTN_TORCH_CXX_STANDARD ${CMAKE_MATCH_1})
endif()
message(STATUS "sciattn: the extension is compiled as C++${SCIATTN_TORCH_CXX_STANDARD}, as torch "
               "${SCIATTN_TORCH_VERSION} requires")
