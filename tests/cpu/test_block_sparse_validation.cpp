// Tests of every rejection of the block-sparse ops (MatMul forward and backward, Softmax forward
// and backward, sparse attention forward and backward, the padding helpers): each bad argument
// gives the documented StatusCode and a message that names the argument, from can_implement and
// from run, workspace_size is 0, and nothing is written. Test layer (tests/cpu).
#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "block_sparse_test_util.h"

namespace sciattn {
namespace {

using namespace sciattn::bstest;

constexpr StatusCode kInvalid = StatusCode::kInvalidArgument;
constexpr StatusCode kNotSupported = StatusCode::kNotSupported;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A view that aliases part of another: the same data shifted by one element.
TensorView shifted(TensorView t) {
  t.data = static_cast<char*>(t.data) + dtype_size(t.dtype);
  return t;
}

// A view whose elements share addresses (stride 0 on its first dimension).
TensorView broadcast(TensorView t) {
  t.strides[0] = 0;
  return t;
}

TensorView on_cuda(TensorView t) {
  t.device = Device::kCuda;
  return t;
}

TensorView with_dtype(TensorView t, DType d) {
  t.dtype = d;
  return t;
}

TensorView resized(TensorView t, int dim, int64_t size) {
  t.sizes[dim] = size;
  return t;
}

TensorView with_rank(TensorView t, int rank) {
  t.rank = rank;
  return t;
}

template <class Params>
struct Case {
  std::string what;
  std::function<void(Params&)> mutate;
  StatusCode code;
  std::string name;  // the argument the message must name
};

// Runs every case: can_implement and run reject with the code and a message naming the
// argument, workspace_size is 0, and the poisoned outputs stay untouched.
template <class Params>
void expect_rejections(const Params& valid, const std::vector<Case<Params>>& cases,
                       const std::vector<const HostTensor*>& outputs) {
  std::string why;
  ASSERT_TRUE(can_implement(valid, &why).ok()) << why;
  for (const Case<Params>& c : cases) {
    SCOPED_TRACE(c.what);
    Params p = valid;
    c.mutate(p);
    const Status s = can_implement(p, &why);
    EXPECT_EQ(s.code(), c.code) << s.to_string();
    EXPECT_EQ(why, s.message());
    EXPECT_TRUE(mentions(s.message(), c.name)) << "'" << c.name << "' not in: " << s.message();
    EXPECT_EQ(workspace_size(p), 0u);
    std::vector<std::byte> ws(1 << 20);
    const Status r = run(p, ws.data(), ws.size());
    EXPECT_EQ(r.code(), c.code) << r.to_string();
    EXPECT_EQ(r.message(), s.message());
    for (const HostTensor* out : outputs) EXPECT_TRUE(out->untouched()) << "an output was written";
  }
}

// Workspace errors are the same for every op: too small, and null with a size.
template <class Params>
void expect_workspace_rejections(const Params& p) {
  const size_t need = workspace_size(p);
  ASSERT_GT(need, 0u);
  std::vector<std::byte> ws(need);
  const Status small = run(p, ws.data(), need - 1);
  EXPECT_EQ(small.code(), StatusCode::kWorkspaceTooSmall) << small.to_string();
  EXPECT_TRUE(mentions(small.message(), "workspace")) << small.message();
  const Status null = run(p, nullptr, need);
  EXPECT_EQ(null.code(), kInvalid) << null.to_string();
  EXPECT_TRUE(mentions(null.message(), "workspace")) << null.message();
}

// A layout with rows != cols and a few blocks, so that mixed-up dimensions show.
struct Fixture {
  Layout layout;
  BlockSparseIndex ix, square;
  Fixture() {
    layout = Layout::zeros(2, 3, 2);
    layout.at(0, 0, 0) = layout.at(0, 2, 1) = layout.at(1, 1, 0) = layout.at(1, 1, 1) = 1;
    ix = make_index(layout, 16);
    Layout sq = Layout::zeros(2, 3, 3);
    sq.at(0, 0, 0) = sq.at(0, 1, 1) = sq.at(1, 2, 0) = sq.at(1, 2, 2) = 1;
    square = make_index(sq, 16);
  }
};

// ---- MatMul ----

TEST(BlockSparseValidation, MatMulSdd) {
  Fixture fx;
  const int64_t Z = 2, H = 2, K = 5, M = 48, N = 32;
  HostTensor a = HostTensor::packed(DType::kBF16, {Z, H, M, K});
  HostTensor b = HostTensor::packed(DType::kBF16, {Z, H, K, N});
  HostTensor c = HostTensor::packed(DType::kBF16, {Z, fx.ix.nnz, 16, 16});
  for (HostTensor* t : {&a, &b}) {
    for (int64_t i = 0; i < t->numel(); ++i) t->set(i, 1.0);
  }
  BlockSparseMatMulParams p;
  p.index = &fx.ix;
  p.mode = BlockSparseMatMulMode::kSdd;
  p.a = a.view();
  p.b = b.view();
  p.c = c.view();
  using P = BlockSparseMatMulParams;
  BlockSparseIndex tampered = fx.ix;
  tampered.row_offsets.pop_back();
  // Stored heads that do not divide the heads (or none): the arrays no longer match the counts.
  BlockSparseIndex bad_heads = fx.ix;
  bad_heads.layout_heads = fx.ix.num_heads + 1;
  BlockSparseIndex no_heads = fx.ix;
  no_heads.layout_heads = 0;
  const std::vector<Case<P>> cases = {
      {"no index", [](P& q) { q.index = nullptr; }, kInvalid, "index"},
      {"tampered index", [&](P& q) { q.index = &tampered; }, kInvalid, "index"},
      {"layout_heads not dividing", [&](P& q) { q.index = &bad_heads; }, kInvalid, "index"},
      {"layout_heads 0", [&](P& q) { q.index = &no_heads; }, kInvalid, "index"},
      {"bad mode", [](P& q) { q.mode = static_cast<BlockSparseMatMulMode>(7); }, kInvalid, "mode"},
      {"a null", [](P& q) { q.a.data = nullptr; }, kInvalid, "a"},
      {"a rank", [](P& q) { q.a = with_rank(q.a, 3); }, kInvalid, "a"},
      {"a empty dim", [](P& q) { q.a = resized(q.a, 3, 0); }, kInvalid, "a"},
      {"a heads", [](P& q) { q.a = resized(q.a, 1, 3); }, kInvalid, "a"},
      {"a rows not R*b", [](P& q) { q.a = resized(q.a, 2, 40); }, kInvalid, "a"},
      {"a trans_a shape", [](P& q) { q.trans_a = true; }, kInvalid, "a"},
      {"a bool", [](P& q) { q.a = with_dtype(q.a, DType::kBool); }, kInvalid, "a"},
      {"a stride overflow", [](P& q) { q.a.strides[0] = int64_t{1} << 62; }, kInvalid, "a"},
      {"b inner mismatch", [](P& q) { q.b = resized(q.b, 2, 6); }, kInvalid, "b"},
      {"b cols not C*b", [](P& q) { q.b = resized(q.b, 3, 33); }, kInvalid, "b"},
      {"b batch", [](P& q) { q.b = resized(q.b, 0, 1); }, kInvalid, "b"},
      {"b dtype", [](P& q) { q.b = with_dtype(q.b, DType::kF16); }, kInvalid, "b"},
      {"b device", [](P& q) { q.b = on_cuda(q.b); }, kInvalid, "b"},
      {"c nnz", [](P& q) { q.c = resized(q.c, 1, 3); }, kInvalid, "c"},
      {"c block", [](P& q) { q.c = resized(q.c, 3, 32); }, kInvalid, "c"},
      {"c dtype", [](P& q) { q.c = with_dtype(q.c, DType::kF32); }, kInvalid, "c"},
      {"c last stride", [](P& q) { q.c.strides[3] = 2; }, kInvalid, "c"},
      {"c broadcast", [](P& q) { q.c = broadcast(q.c); }, kInvalid, "c"},
      {"c overlaps a", [](P& q) { q.c.data = q.a.data; }, kInvalid, "c"},
      {"threads", [](P& q) { q.num_threads = -1; }, kInvalid, "num_threads"},
      {"all on cuda",
       [](P& q) {
         q.a = on_cuda(q.a);
         q.b = on_cuda(q.b);
         q.c = on_cuda(q.c);
       },
       kNotSupported, "CUDA"},
  };
  expect_rejections(p, cases, {&c});
  expect_workspace_rejections(p);
}

TEST(BlockSparseValidation, MatMulDsdAndDds) {
  Fixture fx;
  const int64_t Z = 2, H = 2, N = 7;
  HostTensor s = HostTensor::packed(DType::kF32, {Z, fx.ix.nnz, 16, 16});
  HostTensor y = HostTensor::packed(DType::kF32, {Z, H, 32, N});    // dsd: K = C*b = 32
  HostTensor out = HostTensor::packed(DType::kF32, {Z, H, 48, N});  // M = R*b = 48
  for (int64_t i = 0; i < s.numel(); ++i) s.set(i, 1.0);
  for (int64_t i = 0; i < y.numel(); ++i) y.set(i, 1.0);
  BlockSparseMatMulParams p;
  p.index = &fx.ix;
  p.mode = BlockSparseMatMulMode::kDsd;
  p.a = s.view();
  p.b = y.view();
  p.c = out.view();
  using P = BlockSparseMatMulParams;
  const std::vector<Case<P>> dsd = {
      {"a not sparse", [](P& q) { q.a = resized(q.a, 1, 5); }, kInvalid, "a"},
      {"a rank", [](P& q) { q.a = with_rank(q.a, 5); }, kInvalid, "a"},
      {"a null", [](P& q) { q.a.data = nullptr; }, kInvalid, "a"},
      {"b inner", [](P& q) { q.b = resized(q.b, 2, 48); }, kInvalid, "b"},
      {"b trans_a inner", [](P& q) { q.trans_a = true; }, kInvalid, "b"},
      {"b rank", [](P& q) { q.b = with_rank(q.b, 2); }, kInvalid, "b"},
      {"c rows", [](P& q) { q.c = resized(q.c, 2, 32); }, kInvalid, "c"},
      {"c cols", [](P& q) { q.c = resized(q.c, 3, 8); }, kInvalid, "c"},
      {"c overlaps b", [](P& q) { q.c.data = q.b.data; }, kInvalid, "c"},
  };
  expect_rejections(p, dsd, {&out});
  expect_workspace_rejections(p);

  // dds: out [Z, H, M, C*b] = x [Z, H, M, R*b] * S.
  HostTensor x = HostTensor::packed(DType::kF32, {Z, H, N, 48});
  HostTensor out2 = HostTensor::packed(DType::kF32, {Z, H, N, 32});
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, 1.0);
  p.mode = BlockSparseMatMulMode::kDds;
  p.a = x.view();
  p.b = s.view();
  p.c = out2.view();
  const std::vector<Case<P>> dds = {
      {"a inner", [](P& q) { q.a = resized(q.a, 3, 32); }, kInvalid, "a"},
      {"a trans_b inner", [](P& q) { q.trans_b = true; }, kInvalid, "a"},
      {"b not sparse", [](P& q) { q.b = resized(q.b, 2, 32); }, kInvalid, "b"},
      {"b batch", [](P& q) { q.b = resized(q.b, 0, 3); }, kInvalid, "b"},
      {"c cols", [](P& q) { q.c = resized(q.c, 3, 48); }, kInvalid, "c"},
  };
  expect_rejections(p, dds, {&out2});
}

TEST(BlockSparseValidation, MatMulBackward) {
  Fixture fx;
  const int64_t Z = 1, H = 2, K = 3;
  HostTensor a = HostTensor::packed(DType::kF16, {Z, H, 48, K});
  HostTensor b = HostTensor::packed(DType::kF16, {Z, H, K, 32});
  HostTensor dc = HostTensor::packed(DType::kF16, {Z, fx.ix.nnz, 16, 16});
  HostTensor da = HostTensor::packed(DType::kF16, {Z, H, 48, K});
  HostTensor db = HostTensor::packed(DType::kF16, {Z, H, K, 32});
  for (HostTensor* t : {&a, &b, &dc}) {
    for (int64_t i = 0; i < t->numel(); ++i) t->set(i, 0.5);
  }
  BlockSparseMatMulBackwardParams p;
  p.index = &fx.ix;
  p.a = a.view();
  p.b = b.view();
  p.dc = dc.view();
  p.da = da.view();
  p.db = db.view();
  using P = BlockSparseMatMulBackwardParams;
  const std::vector<Case<P>> cases = {
      {"no gradient requested", [](P& q) { q.da.data = q.db.data = nullptr; }, kInvalid, "da"},
      {"dc shape", [](P& q) { q.dc = resized(q.dc, 1, 1); }, kInvalid, "dc"},
      {"dc null", [](P& q) { q.dc.data = nullptr; }, kInvalid, "dc"},
      {"da shape", [](P& q) { q.da = resized(q.da, 3, 4); }, kInvalid, "da"},
      {"da dtype", [](P& q) { q.da = with_dtype(q.da, DType::kBF16); }, kInvalid, "da"},
      {"db shape", [](P& q) { q.db = resized(q.db, 2, 2); }, kInvalid, "db"},
      {"db overlaps dc", [](P& q) { q.db.data = q.dc.data; }, kInvalid, "db"},
      {"da overlaps db", [](P& q) { q.da.data = q.db.data; }, kInvalid, "da"},
      {"threads", [](P& q) { q.num_threads = -3; }, kInvalid, "num_threads"},
      {"cuda",
       [](P& q) {
         q.a = on_cuda(q.a);
         q.b = on_cuda(q.b);
         q.dc = on_cuda(q.dc);
         q.da = on_cuda(q.da);
         q.db = on_cuda(q.db);
       },
       kNotSupported, "CUDA"},
  };
  expect_rejections(p, cases, {&da, &db});
  expect_workspace_rejections(p);
}

// ---- Softmax ----

TEST(BlockSparseValidation, Softmax) {
  Fixture fx;
  const int64_t Z = 2;
  HostTensor x = HostTensor::packed(DType::kF16, {Z, fx.ix.nnz, 16, 16});
  HostTensor y = HostTensor::packed(DType::kF16, {Z, fx.ix.nnz, 16, 16});
  HostTensor rpe = HostTensor::packed(DType::kF32, {Z, 2, 48, 32});
  HostTensor kpm = HostTensor::packed(DType::kBool, {Z, 32});
  HostTensor attn = HostTensor::packed(DType::kF16, {48, 32});
  for (HostTensor* t : {&x, &rpe, &kpm, &attn}) {
    for (int64_t i = 0; i < t->numel(); ++i) t->set(i, 1.0);
  }
  BlockSparseSoftmaxParams p;
  p.index = &fx.ix;
  p.x = x.view();
  p.y = y.view();
  p.rpe = rpe.view();
  p.key_padding_mask = kpm.view();
  p.attn_mask = attn.view();
  using P = BlockSparseSoftmaxParams;
  const std::vector<Case<P>> cases = {
      {"no index", [](P& q) { q.index = nullptr; }, kInvalid, "index"},
      {"x null", [](P& q) { q.x.data = nullptr; }, kInvalid, "x"},
      {"x rank", [](P& q) { q.x = with_rank(q.x, 3); }, kInvalid, "x"},
      {"x batch 0", [](P& q) { q.x = resized(q.x, 0, 0); }, kInvalid, "x"},
      {"x bool", [](P& q) { q.x = with_dtype(q.x, DType::kBool); }, kInvalid, "x"},
      {"y shape", [](P& q) { q.y = resized(q.y, 0, 1); }, kInvalid, "y"},
      {"y dtype", [](P& q) { q.y = with_dtype(q.y, DType::kF32); }, kInvalid, "y"},
      {"y partly overlaps x", [](P& q) { q.y = shifted(q.x); }, kInvalid, "y"},
      {"y overlaps rpe", [](P& q) { q.y.data = q.rpe.data; }, kInvalid, "y"},
      {"scale inf", [](P& q) { q.scale = std::numeric_limits<float>::infinity(); }, kInvalid,
       "scale"},
      {"scale nan", [](P& q) { q.scale = kNaN; }, kInvalid, "scale"},
      {"rpe shape", [](P& q) { q.rpe = resized(q.rpe, 3, 48); }, kInvalid, "rpe"},
      {"rpe bool", [](P& q) { q.rpe = with_dtype(q.rpe, DType::kBool); }, kInvalid, "rpe"},
      {"kpm shape", [](P& q) { q.key_padding_mask = resized(q.key_padding_mask, 1, 48); }, kInvalid,
       "key_padding_mask"},
      {"kpm dtype", [](P& q) { q.key_padding_mask = with_dtype(q.key_padding_mask, DType::kBF16); },
       kInvalid, "key_padding_mask"},
      {"attn shape", [](P& q) { q.attn_mask = resized(q.attn_mask, 0, 32); }, kInvalid,
       "attn_mask"},
      {"attn rank", [](P& q) { q.attn_mask = with_rank(q.attn_mask, 3); }, kInvalid, "attn_mask"},
      {"kpm mode", [](P& q) { q.key_padding_mask_mode = static_cast<MaskMode>(5); }, kInvalid,
       "key_padding_mask_mode"},
      {"attn mode", [](P& q) { q.attn_mask_mode = static_cast<MaskMode>(-1); }, kInvalid,
       "attn_mask_mode"},
      {"threads", [](P& q) { q.num_threads = -1; }, kInvalid, "num_threads"},
      {"cuda",
       [](P& q) {
         q.x = on_cuda(q.x);
         q.y = on_cuda(q.y);
         q.rpe = on_cuda(q.rpe);
         q.key_padding_mask = on_cuda(q.key_padding_mask);
         q.attn_mask = on_cuda(q.attn_mask);
       },
       kNotSupported, "CUDA"},
  };
  expect_rejections(p, cases, {&y});
  expect_workspace_rejections(p);
  // In place (y is x) is accepted.
  P in_place = p;
  in_place.y = in_place.x;
  EXPECT_TRUE(can_implement(in_place).ok());
}

TEST(BlockSparseValidation, SoftmaxBackward) {
  Fixture fx;
  HostTensor y = HostTensor::packed(DType::kF32, {1, fx.ix.nnz, 16, 16});
  HostTensor dy = HostTensor::packed(DType::kF32, {1, fx.ix.nnz, 16, 16});
  HostTensor dx = HostTensor::packed(DType::kF32, {1, fx.ix.nnz, 16, 16});
  for (HostTensor* t : {&y, &dy}) {
    for (int64_t i = 0; i < t->numel(); ++i) t->set(i, 0.25);
  }
  BlockSparseSoftmaxBackwardParams p;
  p.index = &fx.ix;
  p.y = y.view();
  p.dy = dy.view();
  p.dx = dx.view();
  using P = BlockSparseSoftmaxBackwardParams;
  const std::vector<Case<P>> cases = {
      {"y null", [](P& q) { q.y.data = nullptr; }, kInvalid, "y"},
      {"dy shape", [](P& q) { q.dy = resized(q.dy, 2, 8); }, kInvalid, "dy"},
      {"dy dtype", [](P& q) { q.dy = with_dtype(q.dy, DType::kF16); }, kInvalid, "dy"},
      {"dx shape", [](P& q) { q.dx = resized(q.dx, 0, 2); }, kInvalid, "dx"},
      {"dx is y", [](P& q) { q.dx = q.y; }, kInvalid, "dx"},
      {"dx partly overlaps dy", [](P& q) { q.dx = shifted(q.dy); }, kInvalid, "dx"},
      {"scale nan", [](P& q) { q.scale = kNaN; }, kInvalid, "scale"},
      {"index", [](P& q) { q.index = nullptr; }, kInvalid, "index"},
  };
  expect_rejections(p, cases, {&dx});
  expect_workspace_rejections(p);
  P in_place = p;
  in_place.dx = in_place.dy;
  EXPECT_TRUE(can_implement(in_place).ok());
}

// ---- Sparse attention ----

struct AttnTensors {
  Fixture fx;
  const int64_t B = 2, H = 2, L = 48, D = 4;
  HostTensor q, k, v, rpe, kpm, attn, out, lse, dout, dq, dk, dv;
  AttnTensors() {
    for (HostTensor* t : {&q, &k, &v, &dout, &out, &dq, &dk, &dv}) {
      *t = HostTensor::packed(DType::kBF16, {B, H, L, D});
    }
    rpe = HostTensor::with_layout(DType::kF32, {B, H, L, L}, {0, 0, L, 1}, 0, L * L);
    kpm = HostTensor::packed(DType::kF32, {B, L});
    attn = HostTensor::packed(DType::kBool, {L, L});
    lse = HostTensor::packed(DType::kF32, {B, H, L});
    for (HostTensor* t : {&q, &k, &v, &dout, &rpe, &kpm, &attn}) {
      for (int64_t i = 0; i < t->numel(); ++i) t->set(i, 1.0);
    }
  }
  SparseAttentionForwardParams forward() {
    SparseAttentionForwardParams p;
    p.index = &fx.square;
    p.q = q.view();
    p.k = k.view();
    p.v = v.view();
    p.rpe = rpe.view();
    p.key_padding_mask = kpm.view();
    p.attn_mask = attn.view();
    p.out = out.view();
    p.lse = lse.view();
    return p;
  }
  SparseAttentionBackwardParams backward() {
    SparseAttentionBackwardParams p;
    const SparseAttentionForwardParams f = forward();
    p.index = f.index;
    p.q = f.q;
    p.k = f.k;
    p.v = f.v;
    p.rpe = f.rpe;
    p.key_padding_mask = f.key_padding_mask;
    p.attn_mask = f.attn_mask;
    p.out = f.out;
    p.lse = f.lse;
    p.dout = dout.view();
    p.dq = dq.view();
    p.dk = dk.view();
    p.dv = dv.view();
    return p;
  }
};

// q, k and v with a batch of 2^log2_batch broadcast through stride 0 (sizes without memory), and
// no rpe or key_padding_mask (whose batch would no longer match).
void broadcast_batch(SparseAttentionForwardParams& p, int log2_batch) {
  for (TensorView* view : {&p.q, &p.k, &p.v}) {
    view->sizes[0] = int64_t{1} << log2_batch;
    view->strides[0] = 0;
  }
  p.rpe = p.key_padding_mask = TensorView();
}

TEST(BlockSparseValidation, AttentionForward) {
  AttnTensors t;
  using P = SparseAttentionForwardParams;
  const P p = t.forward();
  const std::vector<Case<P>> cases = {
      {"no index", [](P& q) { q.index = nullptr; }, kInvalid, "index"},
      {"non-square index", [&](P& q) { q.index = &t.fx.ix; }, kInvalid, "index"},
      {"q null", [](P& q) { q.q.data = nullptr; }, kInvalid, "q"},
      {"q rank", [](P& q) { q.q = with_rank(q.q, 5); }, kInvalid, "q"},
      {"q heads", [](P& q) { q.q = resized(q.q, 1, 3); }, kInvalid, "q"},
      {"q length", [](P& q) { q.q = resized(q.q, 2, 40); }, kInvalid, "q"},
      {"q zero dim", [](P& q) { q.q = resized(q.q, 3, 0); }, kInvalid, "q"},
      {"out last stride", [](P& q) { q.out.strides[3] = 2; }, kInvalid, "out"},
      {"q bool", [](P& q) { q.q = with_dtype(q.q, DType::kBool); }, kInvalid, "q"},
      {"k shape", [](P& q) { q.k = resized(q.k, 3, 8); }, kInvalid, "k"},
      {"k dtype", [](P& q) { q.k = with_dtype(q.k, DType::kF16); }, kInvalid, "k"},
      {"v shape", [](P& q) { q.v = resized(q.v, 0, 1); }, kInvalid, "v"},
      {"v device", [](P& q) { q.v = on_cuda(q.v); }, kInvalid, "v"},
      {"rpe shape", [](P& q) { q.rpe = resized(q.rpe, 3, 47); }, kInvalid, "rpe"},
      {"rpe dtype", [](P& q) { q.rpe = with_dtype(q.rpe, DType::kF16); }, kInvalid, "rpe"},
      {"kpm shape", [](P& q) { q.key_padding_mask = resized(q.key_padding_mask, 0, 1); }, kInvalid,
       "key_padding_mask"},
      {"kpm dtype", [](P& q) { q.key_padding_mask = with_dtype(q.key_padding_mask, DType::kF16); },
       kInvalid, "key_padding_mask"},
      {"attn shape", [](P& q) { q.attn_mask = resized(q.attn_mask, 1, 1); }, kInvalid, "attn_mask"},
      {"scale", [](P& q) { q.options.scale = kNaN; }, kInvalid, "options.scale"},
      {"kpm mode", [](P& q) { q.options.key_padding_mask_mode = static_cast<MaskMode>(3); },
       kInvalid, "options.key_padding_mask_mode"},
      {"attn mode", [](P& q) { q.options.attn_mask_mode = static_cast<MaskMode>(3); }, kInvalid,
       "options.attn_mask_mode"},
      {"threads", [](P& q) { q.options.num_threads = -2; }, kInvalid, "num_threads"},
      {"algorithm", [](P& q) { q.options.algorithm = static_cast<SparseAttentionAlgorithm>(9); },
       kInvalid, "options.algorithm"},
      {"out shape", [](P& q) { q.out = resized(q.out, 3, 3); }, kInvalid, "out"},
      {"out dtype", [](P& q) { q.out = with_dtype(q.out, DType::kF32); }, kInvalid, "out"},
      {"out is q", [](P& q) { q.out = q.q; }, kInvalid, "out"},
      {"out broadcast", [](P& q) { q.out = broadcast(q.out); }, kInvalid, "out"},
      {"lse shape", [](P& q) { q.lse = resized(q.lse, 2, 47); }, kInvalid, "lse"},
      {"lse dtype", [](P& q) { q.lse = with_dtype(q.lse, DType::kBF16); }, kInvalid, "lse"},
      {"lse overlaps out", [](P& q) { q.lse.data = q.out.data; }, kInvalid, "lse"},
      // Sizes whose products overflow int64, without memory: a batch broadcast through stride 0.
      {"B*H*L*L overflows", [](P& q) { broadcast_batch(q, 62); }, kInvalid, "q"},
      // B*H*L*L fits in int64 but the workspaces' 4-byte values per score (the composite's and
      // the reference's score buffers) would not: B = 2^50, H = 2, L = 48.
      {"score workspace overflows",
       [](P& q) {
         broadcast_batch(q, 50);
         q.options.algorithm = SparseAttentionAlgorithm::kComposite;
       },
       kInvalid, "too large"},
      // Scores fit even at 64 bytes each (B = 2^44: 2^62.2), but the CUDA path's partials per row
      // element of the padded head dim (up to 128 + 2 fp32 values per row) would not.
      {"row workspace overflows", [](P& q) { broadcast_batch(q, 44); }, kInvalid, "q has shape"},
      {"cuda",
       [](P& q) {
         q.q = on_cuda(q.q);
         q.k = on_cuda(q.k);
         q.v = on_cuda(q.v);
         q.rpe = on_cuda(q.rpe);
         q.key_padding_mask = on_cuda(q.key_padding_mask);
         q.attn_mask = on_cuda(q.attn_mask);
         q.out = on_cuda(q.out);
         q.lse = on_cuda(q.lse);
       },
       kNotSupported, "CUDA"},
  };
  expect_rejections(p, cases, {&t.out, &t.lse});
  for (auto alg : {SparseAttentionAlgorithm::kFused, SparseAttentionAlgorithm::kComposite,
                   SparseAttentionAlgorithm::kReference}) {
    P with_alg = p;
    with_alg.options.algorithm = alg;
    expect_workspace_rejections(with_alg);
  }
}

TEST(BlockSparseValidation, AttentionBackward) {
  AttnTensors t;
  using P = SparseAttentionBackwardParams;
  const P p = t.backward();
  const std::vector<Case<P>> cases = {
      {"lse absent", [](P& q) { q.lse.data = nullptr; }, kInvalid, "lse"},
      {"out absent", [](P& q) { q.out.data = nullptr; }, kInvalid, "out"},
      {"dout shape", [](P& q) { q.dout = resized(q.dout, 2, 16); }, kInvalid, "dout"},
      {"dq dtype", [](P& q) { q.dq = with_dtype(q.dq, DType::kF16); }, kInvalid, "dq"},
      {"dk shape", [](P& q) { q.dk = resized(q.dk, 1, 1); }, kInvalid, "dk"},
      {"dv null", [](P& q) { q.dv.data = nullptr; }, kInvalid, "dv"},
      {"dq is dk", [](P& q) { q.dq = q.dk; }, kInvalid, "dq"},
      {"dv overlaps dout", [](P& q) { q.dv = shifted(q.dout); }, kInvalid, "dv"},
      {"q heads", [](P& q) { q.q = resized(q.q, 1, 1); }, kInvalid, "q"},
  };
  expect_rejections(p, cases, {&t.dq, &t.dk, &t.dv});
  for (auto alg : {SparseAttentionAlgorithm::kFused, SparseAttentionAlgorithm::kComposite,
                   SparseAttentionAlgorithm::kReference}) {
    P with_alg = p;
    with_alg.options.algorithm = alg;
    expect_workspace_rejections(with_alg);
  }
}

// ---- Padding helpers ----

void expect_status(const Status& s, StatusCode code, const std::string& name) {
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_TRUE(mentions(s.message(), name)) << "'" << name << "' not in: " << s.message();
}

TEST(BlockSparseValidation, Padding) {
  HostTensor src = HostTensor::packed(DType::kF32, {2, 20, 3});
  for (int64_t i = 0; i < src.numel(); ++i) src.set(i, 1.0);
  HostTensor dst = HostTensor::packed(DType::kF32, {2, 32, 3});
  ASSERT_TRUE(pad_to_block_size(src.view(), 1, 16, 0.0, dst.view()).ok());
  dst.poison();
  TensorView none;
  expect_status(pad_to_block_size(src.view(), 1, 0, 0.0, dst.view()), kInvalid, "block");
  expect_status(pad_to_block_size(none, 1, 16, 0.0, dst.view()), kInvalid, "src");
  expect_status(pad_to_block_size(src.view(), 1, 16, 0.0, none), kInvalid, "dst");
  expect_status(pad_to_block_size(with_rank(src.view(), 0), 0, 16, 0.0, dst.view()), kInvalid,
                "src");
  expect_status(pad_to_block_size(src.view(), 1, 16, 0.0, with_rank(dst.view(), 2)), kInvalid,
                "dst");
  expect_status(pad_to_block_size(src.view(), 3, 16, 0.0, dst.view()), kInvalid, "dim");
  expect_status(pad_to_block_size(src.view(), -1, 16, 0.0, dst.view()), kInvalid, "dim");
  expect_status(pad_to_block_size(resized(src.view(), 0, 0), 1, 16, 0.0, dst.view()), kInvalid,
                "src");
  expect_status(pad_to_block_size(src.view(), 1, 64, 0.0, dst.view()), kInvalid, "dst");
  expect_status(pad_to_block_size(src.view(), 1, 16, 0.0, resized(dst.view(), 2, 4)), kInvalid,
                "dst");
  expect_status(pad_to_block_size(src.view(), 1, 16, 0.0, with_dtype(dst.view(), DType::kF16)),
                kInvalid, "dst");
  expect_status(pad_to_block_size(src.view(), 1, 16, 0.0, broadcast(dst.view())), kInvalid, "dst");
  TensorView over = dst.view();
  over.data = src.view().data;
  expect_status(pad_to_block_size(src.view(), 1, 16, 0.0, over), kInvalid, "dst");
  expect_status(pad_to_block_size(on_cuda(src.view()), 1, 16, 0.0, on_cuda(dst.view())),
                kNotSupported, "src");
  EXPECT_TRUE(dst.untouched());

  HostTensor small = HostTensor::packed(DType::kF32, {2, 20, 3});
  expect_status(unpad_sequence_output(small.view(), 1, dst.view()), kInvalid, "dst");
  expect_status(unpad_sequence_output(dst.view(), 4, small.view()), kInvalid, "dim");
  expect_status(unpad_sequence_output(dst.view(), 1, resized(small.view(), 0, 3)), kInvalid, "dst");

  HostTensor mask = HostTensor::packed(DType::kF32, {2, 32});
  expect_status(padding_key_mask(20, static_cast<MaskMode>(4), mask.view()), kInvalid, "mode");
  expect_status(padding_key_mask(33, MaskMode::kAdd, mask.view()), kInvalid, "valid_len");
  expect_status(padding_key_mask(-1, MaskMode::kAdd, mask.view()), kInvalid, "valid_len");
  expect_status(padding_key_mask(20, MaskMode::kAdd, with_rank(mask.view(), 3)), kInvalid, "dst");
  expect_status(padding_key_mask(20, MaskMode::kAdd, broadcast(mask.view())), kInvalid, "dst");
  expect_status(padding_key_mask(20, MaskMode::kAdd, on_cuda(mask.view())), kNotSupported, "dst");
  EXPECT_TRUE(mask.untouched());
}

}  // namespace
}  // namespace sciattn
