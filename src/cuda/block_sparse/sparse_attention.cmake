# Sources of the fused block-sparse attention kernels (included by src/cuda/CMakeLists.txt; paths
# relative to src/cuda).
list(APPEND sciattn_cuda_sources
  block_sparse/sparse_attention_dispatch.cu
)
