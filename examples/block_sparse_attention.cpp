// Example: block-sparse self-attention (DeepSpeed's SparseSelfAttention) on the CPU through the
// C++ API: a BigBird layout for 256 tokens, the fused forward, and a check that every row's
// output is a weighted mean of V's rows (V is all ones here, so every output is 1).
#include <sciattn/block_sparse_ops.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main() {
  using namespace sciattn;
  const int64_t B = 1, H = 4, L = 256, D = 32;  // Q, K, V: [B, H, L, D]

  BigBirdSparsityConfig config;  // DeepSpeed's class defaults: one random block, window 3
  config.num_heads = H;
  config.seed = 7;
  BlockSparseIndex index;  // built once per layout; the ops point to it
  Status status = build_sparse_attention_index(config, /*max_seq_length=*/L, /*seq_len=*/L, &index);
  if (!status.ok()) {
    std::fprintf(stderr, "index: %s\n", status.to_string().c_str());
    return EXIT_FAILURE;
  }

  const size_t count = static_cast<size_t>(B * H * L * D);
  std::vector<float> q(count), k(count), v(count, 1.0f), out(count);
  for (size_t i = 0; i < count; ++i) {
    q[i] = std::sin(0.1f * static_cast<float>(i));
    k[i] = std::cos(0.07f * static_cast<float>(i));
  }
  SparseAttentionForwardParams p;
  p.index = &index;
  p.q = TensorView::contiguous(q.data(), DType::kF32, {B, H, L, D});
  p.k = TensorView::contiguous(k.data(), DType::kF32, {B, H, L, D});
  p.v = TensorView::contiguous(v.data(), DType::kF32, {B, H, L, D});
  p.out = TensorView::contiguous(out.data(), DType::kF32, {B, H, L, D});
  std::string why;
  if (!can_implement(p, &why).ok()) {
    std::fprintf(stderr, "rejected: %s\n", why.c_str());
    return EXIT_FAILURE;
  }
  std::vector<std::byte> workspace(workspace_size(p));  // the call allocates nothing else
  status = run(p, workspace.data(), workspace.size());
  if (!status.ok()) {
    std::fprintf(stderr, "failed: %s\n", status.to_string().c_str());
    return EXIT_FAILURE;
  }

  double worst = 0.0;
  for (float o : out) worst = std::fmax(worst, std::fabs(o - 1.0));
  std::printf("BigBird, %lld x %lld blocks per head, %lld nonzero blocks; max |out - 1| = %.2e\n",
              static_cast<long long>(index.num_row_blocks),
              static_cast<long long>(index.num_col_blocks), static_cast<long long>(index.nnz),
              worst);
  return worst < 1e-5 ? EXIT_SUCCESS : EXIT_FAILURE;
}
