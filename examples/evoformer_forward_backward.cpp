// Example: Evoformer attention forward and backward on the CPU through the C++ API, for the
// triangle attention of a 24-residue pair representation with a padding mask and a triangle bias.
#include <sciattn/evoformer.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main() {
  using namespace sciattn;
  const int64_t B = 1, N = 24, L = 24, H = 4, D = 32;  // Q, K, V: [B, N, L, H, D]
  const size_t qkv_count = static_cast<size_t>(B * N * L * H * D);

  // Inputs in fp32 here; f16 and bf16 storage work the same way with uint16_t buffers.
  std::vector<float> q(qkv_count), k(qkv_count), v(qkv_count);
  for (size_t i = 0; i < qkv_count; ++i) {
    q[i] = std::sin(0.1f * static_cast<float>(i));
    k[i] = std::cos(0.07f * static_cast<float>(i));
    v[i] = std::sin(0.03f * static_cast<float>(i) + 1.0f);
  }
  // The last 4 residues are padding: a boolean mask, true = attend.
  std::vector<uint8_t> mask(static_cast<size_t>(B * N * L));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < L; ++j) mask[static_cast<size_t>(n * L + j)] = j < L - 4;
  std::vector<float> triangle_bias(static_cast<size_t>(B * H * L * L), 0.25f);

  std::vector<float> out(qkv_count), lse(static_cast<size_t>(B * N * H * L));
  EvoformerForwardParams fwd;
  fwd.q = TensorView::contiguous(q.data(), DType::kF32, {B, N, L, H, D});
  fwd.k = TensorView::contiguous(k.data(), DType::kF32, {B, N, L, H, D});
  fwd.v = TensorView::contiguous(v.data(), DType::kF32, {B, N, L, H, D});
  fwd.bias1 = TensorView::contiguous(mask.data(), DType::kBool, {B, N, 1, 1, L});
  fwd.bias2 = TensorView::contiguous(triangle_bias.data(), DType::kF32, {B, 1, H, L, L});
  fwd.out = TensorView::contiguous(out.data(), DType::kF32, {B, N, L, H, D});
  fwd.lse = TensorView::contiguous(lse.data(), DType::kF32, {B * N, H, L});

  std::string why;
  if (!can_implement(fwd, &why).ok()) {
    std::fprintf(stderr, "forward rejected: %s\n", why.c_str());
    return EXIT_FAILURE;
  }
  std::vector<std::byte> workspace(workspace_size(fwd));  // the call allocates nothing else
  Status status = run(fwd, workspace.data(), workspace.size());
  if (!status.ok()) {
    std::fprintf(stderr, "forward failed: %s\n", status.to_string().c_str());
    return EXIT_FAILURE;
  }

  // Backward: a loss sum(out * dout) with dout = 1; gradients for Q, K, V and the triangle bias
  // (a boolean mask has no gradient).
  std::vector<float> dout(qkv_count, 1.0f), dq(qkv_count), dk(qkv_count), dv(qkv_count);
  std::vector<float> dbias2(triangle_bias.size());
  EvoformerBackwardParams bwd;
  bwd.q = fwd.q;
  bwd.k = fwd.k;
  bwd.v = fwd.v;
  bwd.bias1 = fwd.bias1;
  bwd.bias2 = fwd.bias2;
  bwd.out = fwd.out;
  bwd.lse = fwd.lse;
  bwd.dout = TensorView::contiguous(dout.data(), DType::kF32, {B, N, L, H, D});
  bwd.dq = TensorView::contiguous(dq.data(), DType::kF32, {B, N, L, H, D});
  bwd.dk = TensorView::contiguous(dk.data(), DType::kF32, {B, N, L, H, D});
  bwd.dv = TensorView::contiguous(dv.data(), DType::kF32, {B, N, L, H, D});
  bwd.dbias2 = TensorView::contiguous(dbias2.data(), DType::kF32, {B, 1, H, L, L});
  workspace.resize(workspace_size(bwd));
  status = run(bwd, workspace.data(), workspace.size());
  if (!status.ok()) {
    std::fprintf(stderr, "backward failed: %s\n", status.to_string().c_str());
    return EXIT_FAILURE;
  }

  // Each row of softmax sums to 1, so with dout = 1 the gradient of the bias sums to ~0 per row;
  // masked keys get exactly zero gradient.
  double row_sum = 0, masked_dv = 0;
  for (int64_t j = 0; j < L; ++j) row_sum += dbias2[static_cast<size_t>(j)];
  for (int64_t d = 0; d < D; ++d)
    masked_dv += std::fabs(dv[static_cast<size_t>((L - 1) * H * D + d)]);
  std::printf("out[0,0,0,0,:4] = %.4f %.4f %.4f %.4f\n", out[0], out[1], out[2], out[3]);
  std::printf("lse[0,0,0] = %.4f\n", lse[0]);
  std::printf("sum_j dbias2[0,0,0,0,j] = %.2e (softmax rows sum to one)\n", row_sum);
  std::printf("|dv| of a masked key = %.1f\n", masked_dv);
  return std::fabs(row_sum) < 1e-4 && masked_dv == 0.0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
