# Sources of the fused block-sparse attention kernels (included by src/cuda/CMakeLists.txt; paths
# relative to src/cuda). One generated .cu file per (direction, head dim, dtype) from
# block_sparse/sparse_attention_instance.cu.in, for the head dims of SCIATTN_HEAD_DIMS the kernels
# take (32, 64, 128; smaller ones run padded to 32) and the dtypes f16 / bf16 of SCIATTN_DTYPES;
# the fp32 kernels are always built. The dispatch learns which exist through
# SCIATTN_SPARSE_HD<D> / SCIATTN_SPARSE_<DTYPE> definitions.
set(sparse_attention_definitions "")
foreach(dim ${SCIATTN_HEAD_DIMS})
  if(NOT dim MATCHES "^(32|64|128)$")
    continue()  # 8 and 16 are Evoformer's; the sparse kernels run those padded to 32
  endif()
  list(APPEND sparse_attention_definitions SCIATTN_SPARSE_HD${dim}=1)
  foreach(dtype ${SCIATTN_DTYPES})
    if(dtype STREQUAL "f16")
      set(CUDA_TYPE "__half")
    elseif(dtype STREQUAL "bf16")
      set(CUDA_TYPE "__nv_bfloat16")
    else()
      continue()  # f32 runs on the always-built CUDA-core kernels
    endif()
    foreach(DIRECTION forward backward)
      set(HEAD_DIM ${dim})
      set(DTYPE ${dtype})
      if(DIRECTION STREQUAL "forward")
        set(short fwd)
      else()
        set(short bwd)
      endif()
      set(file
        ${CMAKE_CURRENT_BINARY_DIR}/block_sparse/sparse_attention_${short}_hd${dim}_${dtype}_sm90.cu)
      configure_file(block_sparse/sparse_attention_instance.cu.in ${file} @ONLY)
      list(APPEND sciattn_cuda_sources ${file})
    endforeach()
  endforeach()
endforeach()
foreach(dtype ${SCIATTN_DTYPES})
  if(dtype MATCHES "^(f16|bf16)$")
    string(TOUPPER ${dtype} upper)
    list(APPEND sparse_attention_definitions SCIATTN_SPARSE_${upper}=1)
  endif()
endforeach()
set_source_files_properties(block_sparse/sparse_attention_dispatch.cu
  PROPERTIES COMPILE_DEFINITIONS "${sparse_attention_definitions}")

list(APPEND sciattn_cuda_sources
  block_sparse/sparse_attention_dispatch.cu
  block_sparse/sparse_attention_f32.cu
)
