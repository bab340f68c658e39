// Evoformer attention (the DS4Sci_EvoformerAttention math): public Params and the op protocol.
// Public API layer (plain C++17). Semantics: ../../docs/evoformer.md and the project spec.
//
//   O[b,n,i,h,:] = sum_j softmax_j( scale * <Q[b,n,i,h,:], K[b,n,j,h,:]>
//                                   + bias1[b,n,0,0,j] + bias2[b,0,h,i,j] ) * V[b,n,j,h,:]
//
// Usage, for either direction:
//   std::string why;
//   if (!can_implement(p, &why).ok()) ...;          // nothing runs, `why` says what is wrong
//   std::vector<std::byte> ws(workspace_size(p));   // the call allocates nothing itself
//   Status s = run(p, ws.data(), ws.size(), stream);
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "sciattn/device.h"
#include "sciattn/status.h"
#include "sciattn/tensor_view.h"

namespace sciattn {

// Which CPU implementation runs a call. Ignored for Device::kCuda tensors.
enum class EvoformerCpuAlgorithm : int {
  // Tiled and multithreaded: streams over key tiles with an online softmax, never holds more than
  // one score tile per thread, and gives the same bits for any thread count.
  kTiled = 0,
  // The plain reference: one thread, materialises every score matrix [B, N, H, L, L] in fp32.
  // It is the specification the other paths are tested against, and the "naive" baseline.
  kReference = 1,
};

// Options shared by both directions.
struct EvoformerOptions {
  // Multiplies <q, k>; std::nullopt means 1 / sqrt(D).
  std::optional<float> scale;
  // CPU only: the most threads to use; 0 means all hardware threads. The tiled path uses fewer
  // when the call has less work than keeps them busy (one thread below a few milliseconds of
  // work), since on a busy machine a thread can cost more to wait for than it saves. Results do
  // not depend on it.
  int num_threads = 0;
  EvoformerCpuAlgorithm cpu_algorithm = EvoformerCpuAlgorithm::kTiled;
};

struct EvoformerForwardParams {
  TensorView q;      // [B, N, L, H, D]  f32, f16 or bf16; any strides, unit stride on D
  TensorView k;      // [B, N, L, H, D]  same dtype as q
  TensorView v;      // [B, N, L, H, D]  same dtype as q
  TensorView bias1;  // optional [B, N, 1, 1, L]  q's dtype, f32, or bool (true = attend)
  TensorView bias2;  // optional [B, 1, H, L, L]  q's dtype or f32
  TensorView out;    // [B, N, L, H, D]  q's dtype (written)
  TensorView lse;    // optional [B*N, H, L] f32: log-sum-exp of each row's scores (written);
                     // -inf for a row whose every key is masked. The backward needs it.
  EvoformerOptions options;
};

struct EvoformerBackwardParams {
  TensorView q, k, v;  // [B, N, L, H, D]  as in the forward
  TensorView bias1;    // optional [B, N, 1, 1, L]  as in the forward
  TensorView bias2;    // optional [B, 1, H, L, L]  as in the forward
  TensorView out;      // [B, N, L, H, D]  the forward's output
  TensorView lse;      // [B*N, H, L] f32  the forward's log-sum-exp (required)
  TensorView dout;     // [B, N, L, H, D]  gradient of the loss w.r.t. out, q's dtype
  TensorView dq;       // [B, N, L, H, D]  q's dtype (written)
  TensorView dk;       // [B, N, L, H, D]  q's dtype (written)
  TensorView dv;       // [B, N, L, H, D]  q's dtype (written)
  TensorView dbias1;   // optional [B, N, 1, 1, L]  bias1's dtype (written); needs a float bias1
  TensorView dbias2;   // optional [B, 1, H, L, L]  bias2's dtype (written); needs bias2
  EvoformerOptions options;
};

// Checks every argument; on rejection returns kInvalidArgument (or kNotSupported) and, when `why`
// is not null, also stores the message there. Nothing is read through the pointers.
Status can_implement(const EvoformerForwardParams& p, std::string* why = nullptr);
Status can_implement(const EvoformerBackwardParams& p, std::string* why = nullptr);

// Bytes of scratch memory `run` needs for these params (0 is possible). The call allocates nothing
// else, so this is the call's whole extra memory. Returns 0 for params that can_implement rejects.
size_t workspace_size(const EvoformerForwardParams& p);
size_t workspace_size(const EvoformerBackwardParams& p);

// Validates (as can_implement), then runs. `workspace` must hold workspace_size(p) bytes, aligned
// to 64 bytes, on the tensors' device. The stream is ignored on the CPU.
Status run(const EvoformerForwardParams& p, void* workspace, size_t workspace_bytes,
           Stream stream = {});
Status run(const EvoformerBackwardParams& p, void* workspace, size_t workspace_bytes,
           Stream stream = {});

// The FLOP counts used in reports: forward 4*S*D, backward 10*S*D, S = B*N*H*L*L.
double evoformer_forward_flops(const EvoformerForwardParams& p);
double evoformer_backward_flops(const EvoformerBackwardParams& p);

}  // namespace sciattn
