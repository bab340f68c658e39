# `cmake --install`: the public headers, the libraries, the `sciattn` program and a CMake package
# (find_package(sciattn CONFIG)) with the targets
#   sciattn::sciattn   the library (CPU path; the CUDA kernels too when built, through sciattn::cuda)
#   sciattn::cuda      the CUDA kernels (SCIATTN_WITH_CUDA builds; linked by sciattn::sciattn)
#   sciattn::train     the GPT trainer (when SCIATTN_BUILD_TRAINER is on), with
#   sciattn::train_core  its BLAS-free optimizer parts (AdamW, loss scaling, clipping)
# and the components `cuda` and `train` for find_package(sciattn CONFIG COMPONENTS ...). The
# Python package's build (pip) installs only its extension: SCIATTN_INSTALL is off there.
# Included last by the top-level CMakeLists.txt.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(sciattn_cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/sciattn)
set(sciattn_export_targets sciattn sciattn_sparse_tiles sciattn_warnings)
if(TARGET sciattn_cuda)
  set_target_properties(sciattn_cuda PROPERTIES EXPORT_NAME cuda)
  list(APPEND sciattn_export_targets sciattn_cuda)
endif()
if(TARGET sciattn_train)
  # sciattn_train links sciattn_train_core (AdamW, loss scaling, clipping) publicly.
  set_target_properties(sciattn_train PROPERTIES EXPORT_NAME train)
  set_target_properties(sciattn_train_core PROPERTIES EXPORT_NAME train_core)
  list(APPEND sciattn_export_targets sciattn_train sciattn_train_core)
endif()
# sciattn_warnings (compile options only) rides along because the static libraries name it as a
# link-only dependency; linking it adds nothing to a consumer's build.
install(TARGETS ${sciattn_export_targets} EXPORT sciattn-targets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
set(sciattn_header_excludes "")
if(NOT TARGET sciattn_train)
  set(sciattn_header_excludes PATTERN "train" EXCLUDE)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/sciattn DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h" ${sciattn_header_excludes})
if(TARGET sciattn_cli)
  install(TARGETS sciattn_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(EXPORT sciattn-targets NAMESPACE sciattn:: FILE sciattnTargets.cmake
        DESTINATION ${sciattn_cmake_dir})

# What the config file must find or recreate for the exported targets' link dependencies.
set(SCIATTN_PACKAGE_HAS_CUDA OFF)
if(TARGET sciattn_cuda)
  set(SCIATTN_PACKAGE_HAS_CUDA ON)
endif()
set(SCIATTN_PACKAGE_HAS_TRAIN OFF)
set(SCIATTN_PACKAGE_BLAS_LIBRARIES "")
if(TARGET sciattn_train)
  set(SCIATTN_PACKAGE_HAS_TRAIN ON)
  set(SCIATTN_PACKAGE_BLAS_LIBRARIES "${BLAS_LIBRARIES}")
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/sciattnConfig.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/sciattnConfig.cmake
                              INSTALL_DESTINATION ${sciattn_cmake_dir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/sciattnConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/sciattnConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/sciattnConfigVersion.cmake
        DESTINATION ${sciattn_cmake_dir})
