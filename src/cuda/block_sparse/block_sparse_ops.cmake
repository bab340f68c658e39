# Sources of the GPU MatMul / Softmax / composite attention (included by src/cuda/CMakeLists.txt;
# paths relative to src/cuda).
list(APPEND sciattn_cuda_sources
  block_sparse/block_sparse_ops_dispatch.cu
  block_sparse/block_sparse_matmul.cu
  block_sparse/block_sparse_softmax.cu
  block_sparse/sparse_attention_composite.cu
)
