// Tests of every rejection of the Evoformer op (can_implement, workspace_size and run, forward and
// backward): each bad argument gives the documented StatusCode and a message that names the
// argument, and nothing is written. Test layer (tests/cpu).
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "evoformer_test_util.h"
#include "sciattn/device.h"

namespace sciattn {
namespace {

using namespace sciattn::test;

// True when `name` occurs in `message` as a whole word (not as part of a longer identifier), so
// that "out" is not found in "dout" nor "q" in "seq".
bool mentions(const std::string& message, const std::string& name) {
  auto is_word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t pos = message.find(name); pos != std::string::npos;
       pos = message.find(name, pos + 1)) {
    const bool left_ok = pos == 0 || !is_word(message[pos - 1]);
    const size_t end = pos + name.size();
    const bool right_ok = end >= message.size() || !is_word(message[end]);
    if (left_ok && right_ok) return true;
  }
  return false;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : " or ") + n;
  return s;
}

// Valid tensors for both directions: sizes that differ in every dimension (so that any mixed-up
// dimension shows), bf16 q / k / v with bf16 biases by default, inputs filled with random values
// and outputs poisoned.
struct ValidTensors {
  EvoShape s{2, 3, 5, 2, 4};
  HostTensor q, k, v, bias1, bias2, out, lse, dout, dq, dk, dv, dbias1, dbias2;

  explicit ValidTensors(DType dtype = DType::kBF16, std::optional<DType> bias1_dtype = DType::kBF16,
                        std::optional<DType> bias2_dtype = DType::kBF16) {
    std::mt19937_64 rng(kBaseSeed + 4000);
    q = HostTensor::packed(dtype, s.qkv());
    k = HostTensor::packed(dtype, s.qkv());
    v = HostTensor::packed(dtype, s.qkv());
    dout = HostTensor::packed(dtype, s.qkv());
    for (HostTensor* t : {&q, &k, &v, &dout}) fill_normal(*t, rng);
    if (bias1_dtype) {
      bias1 = HostTensor::packed(*bias1_dtype, s.bias1());
      for (int64_t i = 0; i < bias1.numel(); ++i) bias1.set(i, i % 3 != 0 ? 1.0 : 0.0);
      if (*bias1_dtype != DType::kBool) {
        dbias1 = HostTensor::packed(*bias1_dtype, s.bias1());
        fill_normal(bias1, rng);
      }
    }
    if (bias2_dtype) {
      bias2 = HostTensor::packed(*bias2_dtype, s.bias2());
      fill_normal(bias2, rng);
      dbias2 = HostTensor::packed(*bias2_dtype, s.bias2());
    }
    out = HostTensor::packed(dtype, s.qkv());
    lse = HostTensor::packed(DType::kF32, s.lse());
    dq = HostTensor::packed(dtype, s.qkv());
    dk = HostTensor::packed(dtype, s.qkv());
    dv = HostTensor::packed(dtype, s.qkv());
    // The backward's out and lse are inputs: give them finite values.
    fill_normal(out, rng);
    for (int64_t i = 0; i < lse.numel(); ++i) lse.set(i, 2.0);
  }

  EvoformerForwardParams fwd(EvoformerCpuAlgorithm algo = EvoformerCpuAlgorithm::kTiled) const {
    EvoformerForwardParams p;
    p.q = q.view();
    p.k = k.view();
    p.v = v.view();
    p.bias1 = bias1.view();
    p.bias2 = bias2.view();
    p.out = out.view();
    p.lse = lse.view();
    p.options.cpu_algorithm = algo;
    return p;
  }

  EvoformerBackwardParams bwd(EvoformerCpuAlgorithm algo = EvoformerCpuAlgorithm::kTiled) const {
    EvoformerBackwardParams p;
    p.q = q.view();
    p.k = k.view();
    p.v = v.view();
    p.bias1 = bias1.view();
    p.bias2 = bias2.view();
    p.out = out.view();
    p.lse = lse.view();
    p.dout = dout.view();
    p.dq = dq.view();
    p.dk = dk.view();
    p.dv = dv.view();
    p.dbias1 = dbias1.view();
    p.dbias2 = dbias2.view();
    p.options.cpu_algorithm = algo;
    return p;
  }
};

// Checks one rejection everywhere it can show: can_implement (with and without `why`),
// workspace_size (0 for rejected params) and run (the same code, nothing written). `names` lists
// the acceptable argument names; the message must contain at least one as a word.
template <class Params>
void expect_rejected(const Params& p, StatusCode code, const std::vector<std::string>& names,
                     bool try_run = true) {
  std::string why = "unchanged";
  const Status s = can_implement(p, &why);
  EXPECT_EQ(s.code(), code) << "got " << s.to_string();
  EXPECT_FALSE(s.message().empty());
  EXPECT_EQ(why, s.message()) << "why must receive the message";
  bool named = false;
  for (const std::string& n : names) named = named || mentions(s.message(), n);
  EXPECT_TRUE(named) << "the message does not name " << join(names) << ": " << s.message();
  EXPECT_EQ(can_implement(p).code(), code);
  EXPECT_EQ(workspace_size(p), 0u) << "workspace_size of rejected params";
  if (try_run) {
    std::vector<std::byte> ws(1 << 20);
    const Status r = run(p, ws.data(), ws.size());
    EXPECT_EQ(r.code(), code) << "run: " << r.to_string();
    bool run_named = false;
    for (const std::string& n : names) run_named = run_named || mentions(r.message(), n);
    EXPECT_TRUE(run_named) << "run's message does not name " << join(names) << ": " << r.message();
  }
}

struct Mutation {
  std::string what;
  std::vector<std::string> names;
  StatusCode code;
  std::function<void(EvoformerForwardParams&)> fwd;   // may be empty
  std::function<void(EvoformerBackwardParams&)> bwd;  // may be empty
};

// Applies each mutation to a valid forward / backward and checks the rejection; afterwards every
// output tensor must still be untouched.
void check_mutations(const ValidTensors& setup, const std::vector<Mutation>& mutations) {
  for (const Mutation& m : mutations) {
    SCOPED_TRACE(m.what);
    if (m.fwd) {
      EvoformerForwardParams p = setup.fwd();
      m.fwd(p);
      expect_rejected(p, m.code, m.names);
    }
    if (m.bwd) {
      EvoformerBackwardParams p = setup.bwd();
      m.bwd(p);
      expect_rejected(p, m.code, m.names);
    }
  }
  for (const HostTensor* t : {&setup.dq, &setup.dk, &setup.dv, &setup.dbias1, &setup.dbias2}) {
    EXPECT_TRUE(!t->present() || t->untouched()) << "a rejected call wrote an output";
  }
}

// The same change to the forward and the backward params (fields present in both).
template <class F>
Mutation both(std::string what, std::vector<std::string> names, F f,
              StatusCode code = StatusCode::kInvalidArgument) {
  return Mutation{std::move(what), std::move(names), code, [f](EvoformerForwardParams& p) { f(p); },
                  [f](EvoformerBackwardParams& p) { f(p); }};
}
template <class F>
Mutation fwd_only(std::string what, std::vector<std::string> names, F f) {
  return Mutation{std::move(what), std::move(names), StatusCode::kInvalidArgument,
                  [f](EvoformerForwardParams& p) { f(p); }, nullptr};
}
template <class F>
Mutation bwd_only(std::string what, std::vector<std::string> names, F f) {
  return Mutation{std::move(what), std::move(names), StatusCode::kInvalidArgument, nullptr,
                  [f](EvoformerBackwardParams& p) { f(p); }};
}

template <class T>
T* shifted(void* data, int64_t elems) {
  return static_cast<T*>(data) + elems;
}

// ---- The valid baseline. ----

TEST(EvoformerValidation, BaselineIsValid) {
  for (EvoformerCpuAlgorithm algo :
       {EvoformerCpuAlgorithm::kTiled, EvoformerCpuAlgorithm::kReference}) {
    ValidTensors setup;
    std::string why;
    EXPECT_TRUE(can_implement(setup.fwd(algo), &why).ok()) << why;
    EXPECT_TRUE(can_implement(setup.bwd(algo), &why).ok()) << why;
    EXPECT_TRUE(run_with_workspace(setup.fwd(algo), nullptr).ok());
    EXPECT_TRUE(run_with_workspace(setup.bwd(algo), nullptr).ok());
    // Optional tensors may be left out: no lse in the forward, no biases, no bias gradients.
    EvoformerForwardParams f = setup.fwd(algo);
    f.lse = TensorView();
    f.bias1 = TensorView();
    f.bias2 = TensorView();
    EXPECT_TRUE(can_implement(f, &why).ok()) << why;
    EvoformerBackwardParams b = setup.bwd(algo);
    b.dbias1 = TensorView();
    b.dbias2 = TensorView();
    EXPECT_TRUE(can_implement(b, &why).ok()) << why;
    // A bool bias1 and f32 biases with bf16 q are accepted.
    ValidTensors mixed(DType::kBF16, DType::kBool, DType::kF32);
    EXPECT_TRUE(can_implement(mixed.fwd(algo), &why).ok()) << why;
    EXPECT_TRUE(can_implement(mixed.bwd(algo), &why).ok()) << why;
  }
}

// ---- Missing tensors. ----

TEST(EvoformerValidation, NullRequiredPointers) {
  ValidTensors setup;
  check_mutations(setup,
                  {
                      both("null q", {"q"}, [](auto& p) { p.q.data = nullptr; }),
                      both("null k", {"k"}, [](auto& p) { p.k.data = nullptr; }),
                      both("null v", {"v"}, [](auto& p) { p.v.data = nullptr; }),
                      both("null out", {"out"}, [](auto& p) { p.out.data = nullptr; }),
                      bwd_only("null lse", {"lse"}, [](auto& p) { p.lse.data = nullptr; }),
                      bwd_only("null dout", {"dout"}, [](auto& p) { p.dout.data = nullptr; }),
                      bwd_only("null dq", {"dq"}, [](auto& p) { p.dq.data = nullptr; }),
                      bwd_only("null dk", {"dk"}, [](auto& p) { p.dk.data = nullptr; }),
                      bwd_only("null dv", {"dv"}, [](auto& p) { p.dv.data = nullptr; }),
                  });
}

// ---- Ranks and sizes. ----

TEST(EvoformerValidation, WrongRank) {
  ValidTensors setup;
  check_mutations(
      setup,
      {
          both("q of rank 4", {"q"}, [](auto& p) { p.q.rank = 4; }),
          both("k of rank 6", {"k"},
               [](auto& p) {
                 p.k.rank = 6;
                 p.k.sizes[5] = 1;
                 p.k.strides[5] = 1;
               }),
          both("q with mismatched size and stride lists", {"q"},
               [](auto& p) {
                 p.q = TensorView::strided(p.q.data, p.q.dtype, {2, 3, 5, 2, 4}, {120, 40, 8, 4});
               }),
          both("q of rank 7", {"q"},
               [](auto& p) {
                 p.q = TensorView::contiguous(p.q.data, p.q.dtype, {1, 2, 3, 5, 2, 4, 1});
               }),
          both("out of rank 3", {"out"}, [](auto& p) { p.out.rank = 3; }),
          both("bias1 of rank 4", {"bias1"},
               [](auto& p) {
                 p.bias1 = TensorView::contiguous(p.bias1.data, p.bias1.dtype, {2, 3, 1, 5});
               }),
          both("bias2 of rank 4", {"bias2"},
               [](auto& p) {
                 p.bias2 = TensorView::contiguous(p.bias2.data, p.bias2.dtype, {2, 2, 5, 5});
               }),
          both("lse of rank 2", {"lse"},
               [](auto& p) {
                 p.lse = TensorView::contiguous(p.lse.data, DType::kF32, {12, 5});
               }),
          bwd_only("dq of rank 4", {"dq"}, [](auto& p) { p.dq.rank = 4; }),
          bwd_only("dbias2 of rank 4", {"dbias2"},
                   [](auto& p) {
                     p.dbias2 = TensorView::contiguous(p.dbias2.data, p.dbias2.dtype, {2, 2, 5, 5});
                   }),
      });
}

TEST(EvoformerValidation, WrongSizes) {
  ValidTensors setup;
  check_mutations(
      setup,
      {
          both("k with a different L", {"k"}, [](auto& p) { p.k.sizes[2] = 6; }),
          both("k with a different B", {"k"}, [](auto& p) { p.k.sizes[0] = 1; }),
          both("v with a different H", {"v"}, [](auto& p) { p.v.sizes[3] = 1; }),
          both("v with a different D", {"v"}, [](auto& p) { p.v.sizes[4] = 3; }),
          both("out with a different N", {"out"}, [](auto& p) { p.out.sizes[1] = 2; }),
          both("bias1 with a different L", {"bias1"}, [](auto& p) { p.bias1.sizes[4] = 6; }),
          both("bias1 with a query dim", {"bias1"},
               [](auto& p) {
                 p.bias1.sizes[2] = 5;
                 p.bias1.strides[2] = 0;
               }),
          both("bias1 with a head dim", {"bias1"},
               [](auto& p) {
                 p.bias1.sizes[3] = 2;
                 p.bias1.strides[3] = 0;
               }),
          both("bias1 with a different B", {"bias1"}, [](auto& p) { p.bias1.sizes[0] = 1; }),
          both("bias1 with a different N", {"bias1"}, [](auto& p) { p.bias1.sizes[1] = 2; }),
          both("bias2 with an N dim", {"bias2"},
               [](auto& p) {
                 p.bias2.sizes[1] = 3;
                 p.bias2.strides[1] = 0;
               }),
          both("bias2 with a different H", {"bias2"}, [](auto& p) { p.bias2.sizes[2] = 1; }),
          both("bias2 with a different query L", {"bias2"}, [](auto& p) { p.bias2.sizes[3] = 4; }),
          both("bias2 with a different key L", {"bias2"}, [](auto& p) { p.bias2.sizes[4] = 4; }),
          both("lse with a different L", {"lse"}, [](auto& p) { p.lse.sizes[2] = 6; }),
          both("lse of shape [B, N*H, L]", {"lse"},
               [](auto& p) {
                 p.lse = TensorView::contiguous(p.lse.data, DType::kF32, {2, 6, 5});
               }),
          both("lse with a different H", {"lse"},
               [](auto& p) {
                 p.lse = TensorView::contiguous(p.lse.data, DType::kF32, {6, 1, 5});
               }),
          bwd_only("dout with a different L", {"dout"}, [](auto& p) { p.dout.sizes[2] = 4; }),
          bwd_only("dq with a different H", {"dq"}, [](auto& p) { p.dq.sizes[3] = 1; }),
          bwd_only("dk with a different D", {"dk"}, [](auto& p) { p.dk.sizes[4] = 2; }),
          bwd_only("dv with a different B", {"dv"}, [](auto& p) { p.dv.sizes[0] = 1; }),
          bwd_only("dbias1 with a different L", {"dbias1"}, [](auto& p) { p.dbias1.sizes[4] = 4; }),
          bwd_only("dbias2 with a different L", {"dbias2"}, [](auto& p) { p.dbias2.sizes[3] = 4; }),
      });
}

TEST(EvoformerValidation, ZeroOrNegativeSizes) {
  ValidTensors setup;
  check_mutations(setup, {
                             both("q with L = 0", {"q"}, [](auto& p) { p.q.sizes[2] = 0; }),
                             both("q with D = -4", {"q"}, [](auto& p) { p.q.sizes[4] = -4; }),
                             both("q with B = 0", {"q"}, [](auto& p) { p.q.sizes[0] = 0; }),
                             both("q with H = -1", {"q"}, [](auto& p) { p.q.sizes[3] = -1; }),
                         });
}

// ---- Dtypes. ----

TEST(EvoformerValidation, WrongDtypes) {
  ValidTensors setup;  // bf16 q, k, v, biases
  check_mutations(
      setup,
      {
          both("k in f16 with bf16 q", {"k"}, [](auto& p) { p.k.dtype = DType::kF16; }),
          both("v in f32 with bf16 q", {"v"}, [](auto& p) { p.v.dtype = DType::kF32; }),
          both("out in f16 with bf16 q", {"out"}, [](auto& p) { p.out.dtype = DType::kF16; }),
          both("bias1 in f16 with bf16 q", {"bias1"}, [](auto& p) { p.bias1.dtype = DType::kF16; }),
          both("bias2 in f16 with bf16 q", {"bias2"}, [](auto& p) { p.bias2.dtype = DType::kF16; }),
          both("bool bias2", {"bias2"}, [](auto& p) { p.bias2.dtype = DType::kBool; }),
          both("lse in bf16", {"lse"}, [](auto& p) { p.lse.dtype = DType::kBF16; }),
          both("lse in f16", {"lse"}, [](auto& p) { p.lse.dtype = DType::kF16; }),
          bwd_only("dout in f16", {"dout"}, [](auto& p) { p.dout.dtype = DType::kF16; }),
          bwd_only("dq in f32", {"dq"}, [](auto& p) { p.dq.dtype = DType::kF32; }),
          bwd_only("dk in f16", {"dk"}, [](auto& p) { p.dk.dtype = DType::kF16; }),
          bwd_only("dv in f16", {"dv"}, [](auto& p) { p.dv.dtype = DType::kF16; }),
          bwd_only("dbias1 in f32 with a bf16 bias1", {"dbias1"},
                   [](auto& p) { p.dbias1.dtype = DType::kF32; }),
          bwd_only("dbias2 in f16 with a bf16 bias2", {"dbias2"},
                   [](auto& p) { p.dbias2.dtype = DType::kF16; }),
      });
}

TEST(EvoformerValidation, BoolQueryIsRejected) {
  ValidTensors setup;
  check_mutations(setup, {both("bool q, k, v and out", {"q"}, [](auto& p) {
                    p.q.dtype = p.k.dtype = p.v.dtype = p.out.dtype = DType::kBool;
                  })});
}

TEST(EvoformerValidation, BiasInOtherHalfTypeIsRejected) {
  // f16 q (every q-typed tensor reinterpreted as f16) with a bf16 bias2: neither q's dtype nor
  // f32. Also the other way round for bias1.
  ValidTensors setup;
  auto to_f16 = [](auto& p) {
    p.q.dtype = p.k.dtype = p.v.dtype = p.out.dtype = DType::kF16;
    p.bias1.dtype = DType::kF16;
  };
  check_mutations(setup, {
                             Mutation{"f16 q with bf16 bias2",
                                      {"bias2"},
                                      StatusCode::kInvalidArgument,
                                      [to_f16](EvoformerForwardParams& p) { to_f16(p); },
                                      [to_f16](EvoformerBackwardParams& p) {
                                        to_f16(p);
                                        p.dout.dtype = p.dq.dtype = p.dk.dtype = p.dv.dtype =
                                            DType::kF16;
                                        p.dbias1.dtype = DType::kF16;
                                      }},
                             Mutation{"f16 q with bf16 bias1",
                                      {"bias1"},
                                      StatusCode::kInvalidArgument,
                                      [to_f16](EvoformerForwardParams& p) {
                                        to_f16(p);
                                        p.bias1.dtype = DType::kBF16;
                                        p.bias2.dtype = DType::kF16;
                                      },
                                      nullptr},
                         });
}

TEST(EvoformerValidation, BiasGradientWithoutAFloatBias) {
  {
    SCOPED_TRACE("bool bias1");
    ValidTensors setup(DType::kBF16, DType::kBool, DType::kBF16);
    HostTensor db1 = HostTensor::packed(DType::kBool, setup.s.bias1());
    HostTensor db1_bf16 = HostTensor::packed(DType::kBF16, setup.s.bias1());
    check_mutations(setup, {
                               bwd_only("dbias1 (bool) with a bool bias1", {"dbias1"},
                                        [&](auto& p) { p.dbias1 = db1.view(); }),
                               bwd_only("dbias1 (bf16) with a bool bias1", {"dbias1"},
                                        [&](auto& p) { p.dbias1 = db1_bf16.view(); }),
                           });
  }
  {
    SCOPED_TRACE("no biases");
    ValidTensors setup(DType::kBF16, std::nullopt, std::nullopt);
    HostTensor db1 = HostTensor::packed(DType::kBF16, setup.s.bias1());
    HostTensor db2 = HostTensor::packed(DType::kBF16, setup.s.bias2());
    check_mutations(
        setup,
        {
            bwd_only("dbias1 without bias1", {"dbias1"}, [&](auto& p) { p.dbias1 = db1.view(); }),
            bwd_only("dbias2 without bias2", {"dbias2"}, [&](auto& p) { p.dbias2 = db2.view(); }),
        });
  }
}

// ---- Strides. ----

TEST(EvoformerValidation, NonUnitLastDimStride) {
  ValidTensors setup;
  check_mutations(
      setup,
      {
          both("k with D stride 2", {"k"}, [](auto& p) { p.k.strides[4] = 2; }),
          both("q with D stride 0", {"q"}, [](auto& p) { p.q.strides[4] = 0; }),
          both("out with D stride 2", {"out"}, [](auto& p) { p.out.strides[4] = 2; }),
          both("bias1 with L stride 2", {"bias1"}, [](auto& p) { p.bias1.strides[4] = 2; }),
          both("bias2 with key stride 2", {"bias2"}, [](auto& p) { p.bias2.strides[4] = 2; }),
          bwd_only("dout with D stride 2", {"dout"}, [](auto& p) { p.dout.strides[4] = 2; }),
          bwd_only("dq with D stride 2", {"dq"}, [](auto& p) { p.dq.strides[4] = 2; }),
          bwd_only("dbias2 with key stride 2", {"dbias2"},
                   [](auto& p) { p.dbias2.strides[4] = 2; }),
      });
}

// Addresses that are never dereferenced (only can_implement runs), far enough apart that the
// huge views below do not overlap.
void* fake_address(int i) {
  return reinterpret_cast<void*>(static_cast<uintptr_t>(i) << 44);
}

TEST(EvoformerValidation, SizesTimesStridesOverflowInt64) {
  // N = 2^40 is a valid size on its own (the element count passes 2^31 and 2^32 and must not
  // be truncated), but with an N stride of 2^30 the largest offset is about 2^70.
  const int64_t big = int64_t{1} << 40;
  EvoformerForwardParams p;
  p.q = TensorView::contiguous(fake_address(1), DType::kBF16, {1, big, 1, 1, 1});
  p.k = TensorView::contiguous(fake_address(2), DType::kBF16, {1, big, 1, 1, 1});
  p.v = TensorView::contiguous(fake_address(3), DType::kBF16, {1, big, 1, 1, 1});
  p.out = TensorView::contiguous(fake_address(4), DType::kBF16, {1, big, 1, 1, 1});
  p.lse = TensorView::contiguous(fake_address(5), DType::kF32, {big, 1, 1});
  std::string why;
  ASSERT_TRUE(can_implement(p, &why).ok()) << "the packed huge problem is valid: " << why;
  p.q.strides[1] = int64_t{1} << 30;
  expect_rejected(p, StatusCode::kInvalidArgument, {"q"}, /*try_run=*/false);
  p.q.strides[1] = 1;
  p.k.strides[1] = -(int64_t{1} << 30);  // negative strides overflow just the same
  expect_rejected(p, StatusCode::kInvalidArgument, {"k"}, /*try_run=*/false);

  // The element count itself overflowing int64: 2^21 * 2^21 * 2^21 = 2^63.
  const int64_t s21 = int64_t{1} << 21;
  auto huge = [&](int i) {
    return TensorView::strided(fake_address(i), DType::kBF16, {s21, s21, s21, 1, 1},
                               {0, 0, 1, 1, 1});
  };
  EvoformerForwardParams h;
  h.q = huge(1);
  h.k = huge(2);
  h.v = huge(3);
  h.out = huge(4);
  expect_rejected(h, StatusCode::kInvalidArgument, {"q", "k", "v", "out"}, /*try_run=*/false);
}

TEST(EvoformerValidation, WorkspacesThatWouldOverflowAreRejected) {
  // B*N = 2^60 scores of one element each: every tensor's bytes fit in int64 (lse: 2^62), but
  // the reference backward's five fp32 buffers of 2^60 values (2^62 bytes each) do not fit in
  // size_t, so workspace_size would wrap to a smaller number.
  const int64_t b = int64_t{1} << 30, n = int64_t{1} << 30;
  auto tensor = [&](int i, DType dtype) {
    return TensorView::contiguous(fake_address(i), dtype, {b, n, 1, 1, 1});
  };
  EvoformerBackwardParams p;
  p.q = tensor(1, DType::kBF16);
  p.k = tensor(2, DType::kBF16);
  p.v = tensor(3, DType::kBF16);
  p.out = tensor(4, DType::kBF16);
  p.dout = tensor(5, DType::kBF16);
  p.dq = tensor(6, DType::kBF16);
  p.dk = tensor(7, DType::kBF16);
  p.dv = tensor(8, DType::kBF16);
  p.lse = TensorView::contiguous(fake_address(9), DType::kF32, {b * n, 1, 1});
  p.options.cpu_algorithm = EvoformerCpuAlgorithm::kReference;
  expect_rejected(p, StatusCode::kInvalidArgument, {"q"}, /*try_run=*/false);
  std::string why;
  EXPECT_FALSE(can_implement(p, &why).ok());
  EXPECT_TRUE(mentions(why, "too large")) << why;
}

// ---- Devices, options, overlaps. ----

TEST(EvoformerValidation, MixedDevices) {
  ValidTensors setup;
  check_mutations(
      setup,
      {
          both("k on CUDA", {"k"}, [](auto& p) { p.k.device = Device::kCuda; }),
          both("out on CUDA", {"out"}, [](auto& p) { p.out.device = Device::kCuda; }),
          both("bias2 on CUDA", {"bias2"}, [](auto& p) { p.bias2.device = Device::kCuda; }),
          both("lse on CUDA", {"lse"}, [](auto& p) { p.lse.device = Device::kCuda; }),
          bwd_only("dv on CUDA", {"dv"}, [](auto& p) { p.dv.device = Device::kCuda; }),
          bwd_only("dbias1 on CUDA", {"dbias1"}, [](auto& p) { p.dbias1.device = Device::kCuda; }),
      });
}

TEST(EvoformerValidation, BadOptions) {
  ValidTensors setup;
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  check_mutations(
      setup,
      {
          both("NaN scale", {"scale"}, [=](auto& p) { p.options.scale = nan; }),
          both("+inf scale", {"scale"}, [=](auto& p) { p.options.scale = inf; }),
          both("-inf scale", {"scale"}, [=](auto& p) { p.options.scale = -inf; }),
          both("num_threads = -1", {"num_threads"}, [](auto& p) { p.options.num_threads = -1; }),
          both("num_threads = -64", {"num_threads"}, [](auto& p) { p.options.num_threads = -64; }),
      });
}

TEST(EvoformerValidation, OutputsOverlappingOtherTensors) {
  ValidTensors setup;
  check_mutations(
      setup,
      {
          fwd_only("out == q", {"out"}, [](auto& p) { p.out.data = p.q.data; }),
          fwd_only("out starts inside k", {"out"},
                   [](auto& p) { p.out.data = shifted<uint16_t>(p.k.data, 3); }),
          fwd_only("out ends inside v", {"out"},
                   [](auto& p) { p.out.data = shifted<uint16_t>(p.v.data, -7); }),
          fwd_only("lse inside bias2", {"lse"}, [](auto& p) { p.lse.data = p.bias2.data; }),
          fwd_only("lse overlapping out", {"lse", "out"}, [](auto& p) { p.lse.data = p.out.data; }),
          bwd_only("dq == q", {"dq"}, [](auto& p) { p.dq.data = p.q.data; }),
          bwd_only("dq == dout", {"dq"}, [](auto& p) { p.dq.data = p.dout.data; }),
          bwd_only("dv == out", {"dv"}, [](auto& p) { p.dv.data = p.out.data; }),
          bwd_only("dk overlapping dv", {"dk", "dv"},
                   [](auto& p) { p.dk.data = shifted<uint16_t>(p.dv.data, 1); }),
          bwd_only("dbias2 == bias2", {"dbias2"}, [](auto& p) { p.dbias2.data = p.bias2.data; }),
          bwd_only("dbias1 inside dq", {"dbias1", "dq"},
                   [](auto& p) { p.dbias1.data = shifted<uint16_t>(p.dq.data, 10); }),
          bwd_only("dq overlapping lse", {"dq", "lse"}, [](auto& p) { p.dq.data = p.lse.data; }),
          fwd_only("out with a zero N stride (its elements share addresses)", {"out"},
                   [](auto& p) { p.out.strides[1] = 0; }),
          bwd_only("dk with a zero L stride", {"dk"}, [](auto& p) { p.dk.strides[2] = 0; }),
          bwd_only("dbias2 with key rows that overlap", {"dbias2"},
                   [](auto& p) { p.dbias2.strides[3] = 2; }),
      });
}

// ---- Workspace. ----

template <class Params>
void check_workspace_rules(const Params& p, bool must_need_workspace) {
  const size_t bytes = workspace_size(p);
  if (must_need_workspace) {
    ASSERT_GT(bytes, 0u);
  }
  if (bytes == 0) {
    GTEST_SKIP() << "this configuration needs no workspace";
  }
  std::vector<std::byte> ws(bytes);
  const Status small = run(p, ws.data(), bytes - 1);
  EXPECT_EQ(small.code(), StatusCode::kWorkspaceTooSmall) << small.to_string();
  EXPECT_TRUE(mentions(small.message(), "workspace")) << small.message();
  const Status null_ws = run(p, nullptr, bytes);
  EXPECT_EQ(null_ws.code(), StatusCode::kInvalidArgument) << null_ws.to_string();
  EXPECT_TRUE(mentions(null_ws.message(), "workspace")) << null_ws.message();
  const Status null_zero = run(p, nullptr, 0);
  EXPECT_FALSE(null_zero.ok()) << "no workspace at all for a call that needs " << bytes;
  EXPECT_TRUE(mentions(null_zero.message(), "workspace")) << null_zero.message();
  const Status ok = run(p, ws.data(), bytes);
  EXPECT_TRUE(ok.ok()) << ok.to_string();
  // More than enough is fine too.
  std::vector<std::byte> more(bytes + 4096);
  const Status ok_more = run(p, more.data(), more.size());
  EXPECT_TRUE(ok_more.ok()) << ok_more.to_string();
}

TEST(EvoformerValidation, WorkspaceTooSmallReference) {
  // The reference materialises the score matrices in the workspace, so it always needs one.
  ValidTensors setup;
  {
    SCOPED_TRACE("forward");
    check_workspace_rules(setup.fwd(EvoformerCpuAlgorithm::kReference), true);
  }
  SCOPED_TRACE("backward");
  check_workspace_rules(setup.bwd(EvoformerCpuAlgorithm::kReference), true);
}

TEST(EvoformerValidation, WorkspaceTooSmallTiledForward) {
  ValidTensors setup;
  check_workspace_rules(setup.fwd(EvoformerCpuAlgorithm::kTiled), false);
}

TEST(EvoformerValidation, WorkspaceTooSmallTiledBackward) {
  ValidTensors setup;
  check_workspace_rules(setup.bwd(EvoformerCpuAlgorithm::kTiled), false);
}

TEST(EvoformerValidation, RejectedRunWritesNothing) {
  // A too-small workspace is found before any work: out and lse keep their poison.
  ValidTensors setup;
  const EvoformerForwardParams p = setup.fwd(EvoformerCpuAlgorithm::kReference);
  const size_t bytes = workspace_size(p);
  ASSERT_GT(bytes, 0u);
  std::vector<std::byte> ws(bytes);
  setup.out.poison();
  setup.lse.poison();
  EXPECT_EQ(run(p, ws.data(), bytes - 1).code(), StatusCode::kWorkspaceTooSmall);
  EXPECT_TRUE(setup.out.untouched());
  EXPECT_TRUE(setup.lse.untouched());
  const EvoformerBackwardParams b = setup.bwd(EvoformerCpuAlgorithm::kReference);
  EvoformerBackwardParams bad = b;
  bad.options.num_threads = -1;
  EXPECT_EQ(run(bad, ws.data(), ws.size()).code(), StatusCode::kInvalidArgument);
  for (const HostTensor* t : {&setup.dq, &setup.dk, &setup.dv, &setup.dbias1, &setup.dbias2}) {
    EXPECT_TRUE(t->untouched());
  }
}

// ---- CUDA tensors in a CPU-only build. ----

TEST(EvoformerValidation, CudaTensorsInCpuOnlyBuildAreNotSupported) {
  if (built_with_cuda()) {
    GTEST_SKIP() << "this build has CUDA kernels";
  }
  EXPECT_EQ(cuda_device_count(), 0);
  ValidTensors setup;
  auto to_cuda = [](auto& p) {
    for (TensorView* t : {&p.q, &p.k, &p.v, &p.bias1, &p.bias2, &p.out, &p.lse}) {
      t->device = Device::kCuda;
    }
  };
  EvoformerForwardParams f = setup.fwd();
  to_cuda(f);
  EvoformerBackwardParams b = setup.bwd();
  to_cuda(b);
  for (TensorView* t : {&b.dout, &b.dq, &b.dk, &b.dv, &b.dbias1, &b.dbias2}) {
    t->device = Device::kCuda;
  }
  std::vector<std::byte> ws(1 << 16);
  const Status rf = run(f, ws.data(), ws.size());
  EXPECT_EQ(rf.code(), StatusCode::kNotSupported) << rf.to_string();
  EXPECT_NE(lower(rf.message()).find("cuda"), std::string::npos) << rf.message();
  const Status rb = run(b, ws.data(), ws.size());
  EXPECT_EQ(rb.code(), StatusCode::kNotSupported) << rb.to_string();
  EXPECT_NE(lower(rb.message()).find("cuda"), std::string::npos) << rb.message();
  EXPECT_EQ(can_implement(f).code(), StatusCode::kNotSupported);
  EXPECT_EQ(can_implement(b).code(), StatusCode::kNotSupported);
  EXPECT_TRUE(setup.out.present() && setup.dq.untouched());
}

}  // namespace
}  // namespace sciattn
