// Google Benchmark of the trainer's CUDA back end, layer by layer, at the 1.3B GPT's sizes
// (C 2048, F 8192, V 50,304, H 16, D 128; bf16; token chunk 4096) for 4,096 and 16,384 tokens
// per call, plus the optimizer step's kernels over 2^27 parameters. CUDA events after a warm-up.
// Each row reports ms, TFLOP/s and GB/s (the counts below), `floor_us` = max(FLOPs / 790 TFLOP/s,
// bytes / 4.3 TB/s) (the H200's measured ceilings, ../shared/PERFORMANCE.md) and `of_floor` =
// floor / time, so phase 2 sees where a step's time goes and how far each layer is from its bound.
//
// Counts per call (T tokens; 2-byte activations; what must cross DRAM at least once):
//   linear forward       FLOPs 2 T IC OC        bytes 2 (T IC + IC OC + T OC)
//   linear backward      FLOPs 4 T IC OC        bytes 2 (2 T OC + T IC + IC OC + T IC) + 8 IC OC
//                        (dout read by both products and the bias sum, in, W, din written, the
//                        fp32 dW read and written once; per chunk it is read and written again)
//   layernorm forward    bytes 2 (2 T C) + 8 T
//   layernorm backward   bytes 2 (4 T C) + 8 T   (in, dout, din read and written)
//   gelu fwd / bwd       bytes 2 (2 T F) / 2 (3 T F);  add: 2 (3 T C);  rotary: 2 (2 * 2 T C)
//   embedding forward    bytes 2 (2 T C) (+ 2 T C with learned positions)
//   embedding backward   bytes 2 T C + 8 T C (dout, the touched dwte rows read and written)
//   attention            FLOPs 4 nnz b^2 D forward, 2.5x that backward (the op's counts), dense
//                        causal layout of blocks of 64
//   LM head (tiled)      FLOPs 6 T C V          bytes 2 (5 T V) + ... (logits written by the
//                        product, read and written by the cross-entropy, read by two products)
//   AdamW                bytes 30 per parameter (p, g, m, v read; p, m, v, 16-bit copy written)
//   sum of squares       bytes 4 per element
// Predictions (before any measurement): the products at 600-700 TFLOP/s (75-85% of the ceiling;
// 4096-row chunks are large), the LM head 550-650 (its cross-entropy adds ~6%), attention
// forward ~450 and backward ~350 TFLOP/s at 16K tokens, the elementwise kernels 2.5-3.5 TB/s,
// LayerNorm forward ~2.5 TB/s of its floor's bytes, LayerNorm backward ~60% of its floor (it
// reads in and dout twice: once for din, once for the chunked weight sums), the embedding
// backward well below its floor (a sort and gathered rows; once per step), AdamW ~3 TB/s.
//
//   bench_train_cuda --benchmark_filter='Linear'
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "device_buffer.h"
#include "sciattn/block_sparse_ops.h"
#include "sciattn/device.h"
#include "sciattn/train/cuda_backend.h"
#include "sciattn/train/cuda_optimizer.h"
#include "sciattn/train/gpt.h"

namespace {

using namespace sciattn;
using namespace sciattn::train;
using bench::DeviceBuffer;
using bench::Fill;

constexpr double kMatmulCeiling = 790e12;  // dense bf16 on the H200, measured
constexpr double kCopyCeiling = 4.3e12;    // device-to-device bytes read + written, measured
constexpr int64_t kC = 2048, kF = 8192, kV = 50304, kH = 16, kD = 128;
constexpr DType kDtype = DType::kBF16;

enum Layer : int64_t {
  kEmbeddingForward,
  kEmbeddingBackward,
  kLayerNormForward,
  kLayerNormBackward,
  kQkvForward,
  kQkvBackward,
  kProjForward,
  kProjBackward,
  kFcForward,
  kFcBackward,
  kFcProjForward,
  kFcProjBackward,
  kGeluForward,
  kGeluBackward,
  kRotary,
  kAttentionForward,
  kAttentionBackward,
  kAdd,
  kLmHead,
  kLmHeadLossOnly,
  kLayers
};
const char* kNames[kLayers] = {"embedding fwd",
                               "embedding bwd",
                               "layernorm fwd",
                               "layernorm bwd",
                               "qkv linear fwd",
                               "qkv linear bwd",
                               "proj linear fwd",
                               "proj linear bwd",
                               "fc linear fwd",
                               "fc linear bwd",
                               "fcproj linear fwd",
                               "fcproj linear bwd",
                               "gelu fwd",
                               "gelu bwd",
                               "rotary",
                               "attention fwd",
                               "attention bwd",
                               "add",
                               "lm head loss+grad (tiled)",
                               "lm head loss only"};

// The one back end of the program (its stream, cuBLASLt handle and scratch stay warm).
CudaBackend* backend(Status* status) {
  static std::unique_ptr<CudaBackend> be;
  static Status made = [] {
    CudaBackendOptions o;
    o.compute_dtype = kDtype;
    return make_cuda_backend(o, &be);
  }();
  *status = made;
  return be.get();
}

TensorView tv(const DeviceBuffer& b, DType dtype, std::initializer_list<int64_t> sizes) {
  return TensorView::contiguous(b.ptr, dtype, sizes, Device::kCuda);
}

// Times `call` with CUDA events on the back end's stream and sets the counters.
void time_calls(benchmark::State& state, CudaBackend& be, const std::function<Status()>& call,
                double flops, double bytes) {
  for (int i = 0; i < 2; ++i) {
    Status s = call();
    if (s.ok()) s = be.synchronize();
    if (!s.ok()) {
      state.SkipWithError(s.message().c_str());
      return;
    }
  }
  const cudaStream_t stream = static_cast<cudaStream_t>(be.stream().handle);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (auto _ : state) {
    cudaEventRecord(start, stream);
    const Status s = call();
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    if (!s.ok()) {
      state.SkipWithError(s.message().c_str());
      break;
    }
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms * 1e-3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  const double floor_s = std::max(flops / kMatmulCeiling, bytes / kCopyCeiling);
  state.counters["TFLOP/s"] =
      benchmark::Counter(flops * 1e-12, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GB/s"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["floor_us"] = floor_s * 1e6;
  state.counters["of_floor"] =
      benchmark::Counter(floor_s, benchmark::Counter::kIsIterationInvariantRate);
}

bool all_ok(benchmark::State& state, std::initializer_list<const DeviceBuffer*> buffers) {
  for (const DeviceBuffer* b : buffers) {
    if (b->error != cudaSuccess) {
      state.SkipWithError(cudaGetErrorString(b->error));
      return false;
    }
  }
  return true;
}

// Arguments: layer (Layer), T (tokens per call).
void BM_TrainLayer(benchmark::State& state) {
  if (cuda_device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  Status status;
  CudaBackend* be = backend(&status);
  if (be == nullptr) {
    state.SkipWithError(status.message().c_str());
    return;
  }
  const auto layer = static_cast<Layer>(state.range(0));
  const int64_t T = state.range(1);
  state.SetLabel(kNames[layer]);
  const double es = 2.0;  // bf16
  const double t = static_cast<double>(T), c = kC, f = kF, v = kV;

  switch (layer) {
    case kEmbeddingForward:
    case kEmbeddingBackward: {
      std::vector<int32_t> ids(static_cast<size_t>(T));
      std::mt19937 gen(7);
      for (int32_t& id : ids) id = static_cast<int32_t>(gen() % kV);
      DeviceBuffer tokens(ids.size(), DType::kF32, 0, Fill::kNone);
      if (!all_ok(state, {&tokens})) return;
      cudaMemcpy(tokens.ptr, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice);
      const auto* tok = static_cast<const int32_t*>(tokens.ptr);
      if (layer == kEmbeddingForward) {
        DeviceBuffer wte(kV * kC, kDtype, 1), out(T * kC, kDtype, 0, Fill::kNone);
        if (!all_ok(state, {&wte, &out})) return;
        time_calls(
            state, *be,
            [&] {
              return be->embedding_forward(
                  {tok, 1, T, tv(wte, kDtype, {kV, kC}), TensorView{}, tv(out, kDtype, {T, kC})});
            },
            0, es * 2 * t * c);
      } else {
        DeviceBuffer dout(T * kC, kDtype, 1), dwte(kV * kC, DType::kF32, 0, Fill::kNone);
        if (!all_ok(state, {&dout, &dwte})) return;
        cudaMemset(dwte.ptr, 0, dwte.bytes);
        time_calls(
            state, *be,
            [&] {
              return be->embedding_backward({tok, 1, T, tv(dout, kDtype, {T, kC}),
                                             tv(dwte, DType::kF32, {kV, kC}), TensorView{}});
            },
            0, es * t * c + 8 * t * c);
      }
      return;
    }
    case kLayerNormForward:
    case kLayerNormBackward: {
      DeviceBuffer in(T * kC, kDtype, 1), w(kC, kDtype, 2), b(kC, kDtype, 3),
          out(T * kC, kDtype, 4), mean(T, DType::kF32, 0, Fill::kNone),
          rstd(T, DType::kF32, 0, Fill::kNone), dw(kC, DType::kF32, 5), db(kC, DType::kF32, 6);
      if (!all_ok(state, {&in, &w, &b, &out, &mean, &rstd, &dw, &db})) return;
      const LayerNormParams fwd{tv(in, kDtype, {T, kC}),    tv(w, kDtype, {kC}),
                                tv(b, kDtype, {kC}),        tv(out, kDtype, {T, kC}),
                                tv(mean, DType::kF32, {T}), tv(rstd, DType::kF32, {T})};
      Status s = be->layernorm_forward(fwd);
      if (!s.ok()) {
        state.SkipWithError(s.message().c_str());
        return;
      }
      if (layer == kLayerNormForward) {
        time_calls(
            state, *be, [&] { return be->layernorm_forward(fwd); }, 0, es * 2 * t * c + 8 * t);
      } else {
        DeviceBuffer dout(T * kC, kDtype, 7), din(T * kC, kDtype, 8);
        if (!all_ok(state, {&dout, &din})) return;
        time_calls(
            state, *be,
            [&] {
              return be->layernorm_backward({fwd.in, fwd.weight, fwd.mean, fwd.rstd,
                                             tv(dout, kDtype, {T, kC}), tv(din, kDtype, {T, kC}),
                                             tv(dw, DType::kF32, {kC}), tv(db, DType::kF32, {kC})});
            },
            0, es * 4 * t * c + 8 * t);
      }
      return;
    }
    case kQkvForward:
    case kQkvBackward:
    case kProjForward:
    case kProjBackward:
    case kFcForward:
    case kFcBackward:
    case kFcProjForward:
    case kFcProjBackward: {
      const int64_t IC = layer >= kFcProjForward ? kF : kC;
      const int64_t OC = layer <= kQkvBackward    ? 3 * kC
                         : layer <= kProjBackward ? kC
                         : layer <= kFcBackward   ? kF
                                                  : kC;
      const bool backward = (layer - kQkvForward) % 2 == 1;
      const double ic = static_cast<double>(IC), oc = static_cast<double>(OC);
      DeviceBuffer in(T * IC, kDtype, 1), w(OC * IC, kDtype, 2), b(OC, kDtype, 3),
          out(backward ? 0 : T * OC, kDtype, 0, Fill::kNone);
      if (!all_ok(state, {&in, &w, &b, &out})) return;
      if (!backward) {
        time_calls(
            state, *be,
            [&] {
              return be->linear_forward({tv(in, kDtype, {T, IC}), tv(w, kDtype, {OC, IC}),
                                         tv(b, kDtype, {OC}), tv(out, kDtype, {T, OC})});
            },
            2 * t * ic * oc, es * (t * ic + ic * oc + t * oc));
      } else {
        DeviceBuffer dout(T * OC, kDtype, 4), din(T * IC, kDtype, 0, Fill::kNone),
            dw(OC * IC, DType::kF32, 0, Fill::kNone), db(OC, DType::kF32, 0, Fill::kNone);
        if (!all_ok(state, {&dout, &din, &dw, &db})) return;
        cudaMemset(dw.ptr, 0, dw.bytes);
        cudaMemset(db.ptr, 0, db.bytes);
        time_calls(
            state, *be,
            [&] {
              return be->linear_backward({tv(in, kDtype, {T, IC}), tv(w, kDtype, {OC, IC}),
                                          tv(dout, kDtype, {T, OC}), tv(din, kDtype, {T, IC}),
                                          tv(dw, DType::kF32, {OC, IC}),
                                          tv(db, DType::kF32, {OC})});
            },
            4 * t * ic * oc, es * (2 * t * oc + 2 * t * ic + ic * oc) + 8 * ic * oc);
      }
      return;
    }
    case kGeluForward:
    case kGeluBackward: {
      DeviceBuffer x(T * kF, kDtype, 1), y(T * kF, kDtype, 2);
      if (!all_ok(state, {&x, &y})) return;
      if (layer == kGeluForward) {
        time_calls(
            state, *be,
            [&] {
              return be->gelu_forward({tv(x, kDtype, {T, kF}), tv(y, kDtype, {T, kF})});
            },
            0, es * 2 * t * f);
      } else {
        DeviceBuffer d(T * kF, kDtype, 3);
        if (!all_ok(state, {&d})) return;
        time_calls(
            state, *be,
            [&] {
              return be->gelu_backward(
                  {tv(x, kDtype, {T, kF}), tv(y, kDtype, {T, kF}), tv(d, kDtype, {T, kF})});
            },
            0, es * 3 * t * f);
      }
      return;
    }
    case kRotary: {
      DeviceBuffer qkv(T * 3 * kC, kDtype, 1);
      if (!all_ok(state, {&qkv})) return;
      time_calls(
          state, *be,
          [&] {
            return be->rotary({tv(qkv, kDtype, {1, T, 3, kH, kD}), 10000.0f, false});
          },
          0, es * 2 * 2 * t * c);
      return;
    }
    case kAdd: {
      DeviceBuffer a(T * kC, kDtype, 1), b(T * kC, kDtype, 2), out(T * kC, kDtype, 3);
      if (!all_ok(state, {&a, &b, &out})) return;
      time_calls(
          state, *be,
          [&] {
            return be->add(
                {tv(a, kDtype, {T, kC}), tv(b, kDtype, {T, kC}), tv(out, kDtype, {T, kC})});
          },
          0, es * 3 * t * c);
      return;
    }
    case kAttentionForward:
    case kAttentionBackward: {
      GptConfig config;
      config.vocab_size = kV;
      config.d_model = kC;
      config.n_heads = kH;
      config.n_layers = 1;
      config.sequence_length = T;
      config.max_position_embeddings = T;
      static std::unique_ptr<AttentionPlan> plan;
      if (!plan || plan->padded_length != T) {
        plan = std::make_unique<AttentionPlan>();
        Status s = plan_attention(config, nullptr, plan.get());
        if (s.ok()) s = upload_block_sparse_index(&plan->index, be->device_ordinal());
        if (!s.ok()) {
          plan.reset();
          state.SkipWithError(s.message().c_str());
          return;
        }
      }
      DeviceBuffer qkv(T * 3 * kC, kDtype, 1), out(T * kC, kDtype, 0, Fill::kNone),
          lse(kH * T, DType::kF32, 0, Fill::kNone), dout(T * kC, kDtype, 2),
          dqkv(T * 3 * kC, kDtype, 0, Fill::kNone);
      if (!all_ok(state, {&qkv, &out, &lse, &dout, &dqkv})) return;
      const AttentionParams fwd{&plan->index, tv(qkv, kDtype, {1, T, 3, kH, kD}),
                                tv(out, kDtype, {1, T, kH, kD}), tv(lse, DType::kF32, {1, kH, T})};
      Status s = be->attention_forward(fwd);
      if (!s.ok()) {
        state.SkipWithError(s.message().c_str());
        return;
      }
      const double b = static_cast<double>(plan->block);
      const double fwd_flops = 4.0 * static_cast<double>(plan->index.nnz) * b * b * kD;
      if (layer == kAttentionForward) {
        time_calls(
            state, *be, [&] { return be->attention_forward(fwd); }, fwd_flops, es * 4 * t * c);
      } else {
        time_calls(
            state, *be,
            [&] {
              return be->attention_backward({&plan->index, fwd.qkv, fwd.out, fwd.lse,
                                             tv(dout, kDtype, {1, T, kH, kD}),
                                             tv(dqkv, kDtype, {1, T, 3, kH, kD})});
            },
            2.5 * fwd_flops, es * 8 * t * c);
      }
      return;
    }
    case kLmHead:
    case kLmHeadLossOnly: {
      std::vector<int32_t> ids(static_cast<size_t>(T));
      std::mt19937 gen(11);
      for (int32_t& id : ids) id = static_cast<int32_t>(gen() % kV);
      DeviceBuffer targets(ids.size(), DType::kF32, 0, Fill::kNone), in(T * kC, kDtype, 1),
          w(kV * kC, kDtype, 2), logits(T * kV, kDtype, 0, Fill::kNone),
          losses(T, DType::kF32, 0, Fill::kNone), din(T * kC, kDtype, 0, Fill::kNone),
          dw(kV * kC, DType::kF32, 0, Fill::kNone);
      if (!all_ok(state, {&targets, &in, &w, &logits, &losses, &din, &dw})) return;
      cudaMemcpy(targets.ptr, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice);
      cudaMemset(dw.ptr, 0, dw.bytes);
      LmHeadParams p;
      p.in = tv(in, kDtype, {T, kC});
      p.weight = tv(w, kDtype, {kV, kC});
      p.targets = static_cast<const int32_t*>(targets.ptr);
      p.losses = tv(losses, DType::kF32, {T});
      p.logits = tv(logits, kDtype, {T, kV});
      p.tile_rows = T;
      p.grad_scale = 1.0f / static_cast<float>(T);
      const bool grad = layer == kLmHead;
      if (grad) {
        p.din = tv(din, kDtype, {T, kC});
        p.dweight = tv(dw, DType::kF32, {kV, kC});
      }
      time_calls(
          state, *be, [&] { return be->lm_head_loss(p); }, (grad ? 6 : 2) * t * c * v,
          es * (grad ? 5 : 2) * t * v + es * v * c);
      return;
    }
    default:
      state.SkipWithError("unknown layer");
  }
}

void layers(benchmark::internal::Benchmark* b) {
  b->ArgNames({"layer", "T"});
  for (int64_t layer = 0; layer < kLayers; ++layer) {
    for (int64_t T : {4096, 16384}) b->Args({layer, T});
  }
}
BENCHMARK(BM_TrainLayer)->Apply(layers)->UseManualTime()->Unit(benchmark::kMillisecond);

// The optimizer step over n = 2^27 fp32 parameters (0 AdamW with a bf16 copy, 1 the sum of
// squares of the gradients, 2 unscale with the overflow check).
void BM_TrainOptimizer(benchmark::State& state) {
  if (cuda_device_count() == 0) {
    state.SkipWithError("no CUDA device");
    return;
  }
  Status status;
  CudaBackend* be = backend(&status);
  if (be == nullptr) {
    state.SkipWithError(status.message().c_str());
    return;
  }
  const int64_t n = int64_t{1} << 27;
  const double dn = static_cast<double>(n);
  DeviceBuffer p(n, DType::kF32, 1), g(n, DType::kF32, 2), m(n, DType::kF32, 0, Fill::kNone),
      v(n, DType::kF32, 0, Fill::kNone), copy(n, DType::kBF16, 0, Fill::kNone),
      ws(cuda_sum_squares_workspace(n), DType::kBool, 0, Fill::kNone);
  if (!all_ok(state, {&p, &g, &m, &v, &copy, &ws})) return;
  cudaMemset(m.ptr, 0, m.bytes);
  cudaMemset(v.ptr, 0, v.bytes);
  auto* pp = static_cast<float*>(p.ptr);
  auto* gp = static_cast<float*>(g.ptr);
  switch (state.range(0)) {
    case 0: {
      state.SetLabel("adamw + bf16 copy");
      AdamWHyperparams h;
      h.weight_decay = 0.01f;
      time_calls(
          state, *be,
          [&] {
            return cuda_adamw_step(h, 1, 1.0f, pp, gp, static_cast<float*>(m.ptr),
                                   static_cast<float*>(v.ptr), n, copy.ptr, DType::kBF16,
                                   be->stream());
          },
          0, 30 * dn);
      return;
    }
    case 1: {
      state.SetLabel("sum of squares (waits for the result)");
      SumSquares out;
      time_calls(
          state, *be, [&] { return cuda_sum_squares(gp, n, ws.ptr, ws.bytes, be->stream(), &out); },
          0, 4 * dn);
      return;
    }
    default: {
      state.SetLabel("unscale + overflow check (waits for the flag)");
      bool overflow = false;
      time_calls(
          state, *be,
          [&] {
            return cuda_unscale_and_check(gp, n, 1.0f, ws.ptr, ws.bytes, be->stream(), &overflow);
          },
          0, 8 * dn);
    }
  }
}
BENCHMARK(BM_TrainOptimizer)
    ->ArgNames({"kind"})
    ->DenseRange(0, 2)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
