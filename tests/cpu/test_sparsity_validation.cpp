// Every rejection of the sparsity configs, make_layout and crop_layout: the Status code, and a
// message that names the config and the offending parameter. Test layer (label cpu).
#include <gtest/gtest.h>

#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "common/allocation_status.h"
#include "test_sparsity_util.h"

namespace sciattn {
namespace {

constexpr auto kUni = AttentionDirection::kUnidirectional;

// make_layout must fail with kInvalidArgument, leave *out alone, and say every fragment.
void expect_rejected(const SparsityConfig& config, int64_t seq_len,
                     const std::vector<std::string>& fragments) {
  Layout out = Layout::zeros(1, 1, 1);
  out.blocks[0] = 7;  // poison: a failed call must not write
  Status s = make_layout(config, seq_len, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << to_string(config) << ": " << s.to_string();
  for (const std::string& f : fragments) {
    EXPECT_NE(s.message().find(f), std::string::npos)
        << "message \"" << s.message() << "\" lacks \"" << f << "\"";
  }
  EXPECT_EQ(out.blocks, std::vector<uint8_t>{7});
}

template <typename T>
T with_heads(T c, int64_t heads = 2) {
  c.num_heads = heads;
  return c;
}

const std::vector<SparsityConfig>& all_kinds() {
  static const std::vector<SparsityConfig> kinds = [] {
    UserSparsityConfig user;
    user.num_heads = 2;
    user.layout = Layout::zeros(1, 4, 4);
    return std::vector<SparsityConfig>{with_heads(DenseSparsityConfig{}),
                                       with_heads(FixedSparsityConfig{}),
                                       with_heads(VariableSparsityConfig{}),
                                       with_heads(BigBirdSparsityConfig{}),
                                       with_heads(BSLongformerSparsityConfig{}),
                                       with_heads(LocalSlidingWindowSparsityConfig{}),
                                       user};
  }();
  return kinds;
}

// ---- shared by every config ----

TEST(SparsityValidation, NumHeads) {
  for (SparsityConfig c : all_kinds()) {
    const std::string cls = to_string(c).substr(0, to_string(c).find('('));
    for (int64_t heads : {0, -3}) {
      sparsity_common(c).num_heads = heads;
      expect_rejected(c, 64, {cls, "num_heads (" + std::to_string(heads) + ") must be >= 1"});
      EXPECT_EQ(validate_sparsity_config(c).code(), StatusCode::kInvalidArgument);
    }
  }
}

TEST(SparsityValidation, BlockSize) {
  for (SparsityConfig c : all_kinds()) {
    for (int64_t block : {0, -16, 8, 24, 48, 256}) {
      sparsity_common(c).block = block;
      expect_rejected(c, 256,
                      {"block (" + std::to_string(block) + ") must be one of 16, 32, 64, 128"});
    }
  }
}

TEST(SparsityValidation, SequenceLength) {
  for (const SparsityConfig& c : all_kinds()) {
    expect_rejected(c, 0, {"seq_len (0) must be a positive multiple of block (16)"});
    expect_rejected(c, -32, {"seq_len (-32)"});
    expect_rejected(c, 100, {"seq_len (100)", "block (16)", "pad the sequence to 112 tokens"});
  }
}

TEST(SparsityValidation, LayoutTooLarge) {
  DenseSparsityConfig c;
  c.num_heads = 64;
  // [64, 2^20, 2^20] blocks would be 64 TiB.
  expect_rejected(c, int64_t{16} << 20, {"kMaxLayoutEntries", "[64, 1048576, 1048576]"});
  // And a length whose N * N overflows int64.
  expect_rejected(c, int64_t{16} << 40, {"kMaxLayoutEntries"});
}

// A public function that allocates returns kOutOfMemory, naming itself, where the allocation
// fails: std::bad_alloc never leaves the library.
TEST(SparsityValidation, AllocationFailureBecomesAStatus) {
  const Status s =
      detail::status_of_allocating("make_layout", []() -> Status { throw std::bad_alloc(); });
  EXPECT_EQ(s.code(), StatusCode::kOutOfMemory);
  EXPECT_EQ(s.message().rfind("make_layout: the host is out of memory", 0), 0u) << s.message();
  EXPECT_EQ(s.to_string().rfind("out of memory: make_layout", 0), 0u) << s.to_string();
  const Status ok = detail::status_of_allocating("x", [] { return Status::ok_status(); });
  EXPECT_TRUE(ok.ok());
}

TEST(SparsityValidation, AttentionOutOfRange) {
  const auto bad = static_cast<AttentionDirection>(7);
  FixedSparsityConfig fixed = with_heads(FixedSparsityConfig{});
  fixed.attention = bad;
  VariableSparsityConfig variable = with_heads(VariableSparsityConfig{});
  variable.attention = bad;
  BigBirdSparsityConfig bigbird = with_heads(BigBirdSparsityConfig{});
  bigbird.attention = bad;
  BSLongformerSparsityConfig longformer = with_heads(BSLongformerSparsityConfig{});
  longformer.attention = bad;
  LocalSlidingWindowSparsityConfig local = with_heads(LocalSlidingWindowSparsityConfig{});
  local.attention = bad;
  for (const SparsityConfig& c :
       std::vector<SparsityConfig>{fixed, variable, bigbird, longformer, local}) {
    expect_rejected(c, 128, {"attention (7) must be bidirectional or unidirectional"});
  }
}

// ---- Fixed (DeepSpeed's constructor order, spec 1.2) ----

TEST(SparsityValidation, Fixed) {
  auto base = with_heads(FixedSparsityConfig{});
  auto c = base;
  c.num_local_blocks = 0;
  expect_rejected(c, 128, {"FixedSparsityConfig", "num_local_blocks (0) must be >= 1"});
  c = base;
  c.num_global_blocks = 0;
  expect_rejected(c, 128, {"num_global_blocks (0) must be >= 1"});
  c = base;
  c.num_global_blocks = 3;
  expect_rejected(c, 128, {"num_local_blocks (4) must be divisible by num_global_blocks (3)"});
  c = base;
  c.attention = kUni;
  c.horizontal_global_attention = true;
  expect_rejected(c, 128, {"horizontal_global_attention", "requires attention = bidirectional"});
  c = base;
  c.num_different_global_patterns = 0;
  expect_rejected(c, 128, {"num_different_global_patterns (0) must be >= 1"});
  c = base;
  c.num_different_global_patterns = 2;
  expect_rejected(c, 128,
                  {"num_different_global_patterns (2) > 1 requires "
                   "different_layout_per_head = true"});
  c = base;
  c.different_layout_per_head = true;
  c.num_global_blocks = 2;
  c.num_different_global_patterns = 3;
  expect_rejected(c, 128,
                  {"num_different_global_patterns (3) must be <= num_local_blocks / "
                   "num_global_blocks = 4 / 2 = 2"});
  // Ours: more global blocks than the sequence has (DeepSpeed slices from a negative start).
  c = base;
  c.num_local_blocks = 8;
  c.num_global_blocks = 4;
  expect_rejected(c, 32,
                  {"num_global_blocks (4) must be <= the number of blocks seq_len / "
                   "block = 32 / 16 = 2"});
}

// ---- Variable (spec 1.3) ----

TEST(SparsityValidation, Variable) {
  auto base = with_heads(VariableSparsityConfig{});
  auto c = base;
  c.num_random_blocks = -1;
  expect_rejected(c, 128, {"VariableSparsityConfig", "num_random_blocks (-1) must be >= 0"});
  c = base;
  c.local_window_blocks.clear();
  expect_rejected(c, 128, {"local_window_blocks must not be empty"});
  c = base;
  c.local_window_blocks = {2, -1, 3};
  expect_rejected(c, 128, {"local_window_blocks[1] (-1) must be >= 0"});
  c = base;
  c.local_window_blocks = {2, 0};
  expect_rejected(c, 128, {"local_window_blocks[1] (0), the last size, must be >= 1"});
  c = base;
  c.global_block_indices = {0, -2};
  expect_rejected(c, 128, {"global_block_indices[1] (-2) must be >= 0"});
  c = base;
  c.global_block_indices = {0, 4};
  c.global_block_end_indices = std::vector<int64_t>{2};
  expect_rejected(c, 128,
                  {"global_block_end_indices has 1 entries but global_block_indices has "
                   "2; they must have the same length"});
  c.global_block_end_indices = std::vector<int64_t>{2, 4};
  expect_rejected(c, 128,
                  {"global_block_end_indices[1] (4) must be > global_block_indices[1] (4)"});
  c = base;
  c.attention = kUni;
  c.horizontal_global_attention = true;
  expect_rejected(c, 128, {"VariableSparsityConfig", "horizontal_global_attention"});
  c = base;
  c.num_random_blocks = 9;
  expect_rejected(c, 128,
                  {"num_random_blocks (9) must be <= the number of blocks seq_len / "
                   "block = 128 / 16 = 8"});
  // A zero-sized window before the last is legal in DeepSpeed (an empty window).
  c = base;
  c.local_window_blocks = {2, 0, 3};
  Layout ok;
  EXPECT_TRUE(make_layout(c, 128, &ok).ok());
}

// ---- BigBird (spec 1.4; make_layout's checks in DeepSpeed's order) ----

TEST(SparsityValidation, BigBird) {
  auto base = with_heads(BigBirdSparsityConfig{});
  auto c = base;
  c.num_random_blocks = -1;
  expect_rejected(c, 128, {"BigBirdSparsityConfig", "num_random_blocks (-1) must be >= 0"});
  c = base;
  c.num_sliding_window_blocks = -1;
  expect_rejected(c, 128, {"num_sliding_window_blocks (-1) must be >= 0"});
  c = base;
  c.num_global_blocks = -1;
  expect_rejected(c, 128, {"num_global_blocks (-1) must be >= 0"});
  c = base;
  c.num_random_blocks = 3;
  expect_rejected(c, 32,
                  {"num_random_blocks (3) must be <= the number of blocks seq_len / "
                   "block = 32 / 16 = 2"});
  c = base;
  c.num_sliding_window_blocks = 5;
  expect_rejected(c, 64, {"num_sliding_window_blocks (5) must be <= the number of blocks"});
  c = base;
  c.num_global_blocks = 3;
  c.num_sliding_window_blocks = 1;
  expect_rejected(c, 32, {"num_global_blocks (3) must be <= the number of blocks"});
}

// ---- BSLongformer (spec 1.5) ----

TEST(SparsityValidation, BSLongformer) {
  auto base = with_heads(BSLongformerSparsityConfig{});
  auto c = base;
  c.num_sliding_window_blocks = -2;
  expect_rejected(c, 128,
                  {"BSLongformerSparsityConfig", "num_sliding_window_blocks (-2) must be >= 0"});
  c = base;
  c.global_block_indices = {-1};
  expect_rejected(c, 128, {"global_block_indices[0] (-1) must be >= 0"});
  c = base;
  c.global_block_end_indices = std::vector<int64_t>{};
  expect_rejected(c, 128,
                  {"global_block_end_indices has 0 entries but global_block_indices has 1"});
  c = base;
  c.global_block_indices = {3};
  c.global_block_end_indices = std::vector<int64_t>{1};
  expect_rejected(c, 128,
                  {"global_block_end_indices[0] (1) must be > global_block_indices[0] (3)"});
  c = base;
  c.num_sliding_window_blocks = 9;
  expect_rejected(c, 128,
                  {"num_sliding_window_blocks (9) must be <= the number of blocks "
                   "seq_len / block = 128 / 16 = 8"});
}

// ---- LocalSlidingWindow (spec 1.6) ----

TEST(SparsityValidation, LocalSlidingWindow) {
  auto c = with_heads(LocalSlidingWindowSparsityConfig{});
  c.num_sliding_window_blocks = -1;
  expect_rejected(
      c, 128, {"LocalSlidingWindowSparsityConfig", "num_sliding_window_blocks (-1) must be >= 0"});
  c.num_sliding_window_blocks = 3;
  expect_rejected(c, 32, {"num_sliding_window_blocks (3) must be <= the number of blocks"});
}

// ---- user-supplied layouts ----

TEST(SparsityValidation, UserLayout) {
  UserSparsityConfig base;
  base.num_heads = 2;
  base.layout = Layout::zeros(2, 4, 4);
  auto c = base;
  c.layout = Layout::zeros(3, 4, 4);
  expect_rejected(c, 64, {"UserSparsityConfig", "layout.num_heads (3) must be num_heads (2) or 1"});
  c = base;
  c.layout = Layout::zeros(2, 4, 5);
  expect_rejected(c, 64, {"layout must be square", "num_row_blocks (4)", "num_col_blocks (5)"});
  c = base;
  c.layout = Layout::zeros(2, 0, 0);
  expect_rejected(c, 64, {"layout must be square with at least one block"});
  c = base;
  c.layout.blocks.pop_back();
  expect_rejected(c, 64, {"layout.blocks has 31 entries", "[2, 4, 4]"});
  c = base;
  c.layout.blocks[5] = 2;
  expect_rejected(c, 64, {"layout.blocks[5] (2) must be 0 or 1"});
  expect_rejected(base, 128,
                  {"seq_len / block = 128 / 16 = 8 blocks, but the user layout has 4", "seq_len 64",
                   "crop_layout"});
}

// ---- crop_layout / make_layout_for_length ----

TEST(SparsityValidation, Crop) {
  const Layout full = Layout::zeros(2, 8, 8);
  Layout out = Layout::zeros(1, 1, 1);
  for (auto [block, len] : std::vector<std::pair<int64_t, int64_t>>{
           {16, 0}, {16, -16}, {16, 40}, {16, 144}, {32, 512}}) {
    Status s = crop_layout(full, block, len, &out);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << block << " " << len;
    EXPECT_NE(s.message().find("crop_layout: seq_len (" + std::to_string(len) + ")"),
              std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("of at most 8 blocks"), std::string::npos) << s.message();
  }
  Status s = crop_layout(full, 0, 16, &out);
  EXPECT_NE(s.message().find("crop_layout: block (0) must be >= 1"), std::string::npos);
  EXPECT_EQ(out, Layout::zeros(1, 1, 1));

  auto fixed = with_heads(FixedSparsityConfig{});
  s = make_layout_for_length(fixed, 2048, 4096, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("seq_len (4096) must be <= max_seq_length (2048)"), std::string::npos)
      << s.message();
  s = make_layout_for_length(fixed, 2048, 40, &out);
  EXPECT_NE(s.message().find("crop_layout: seq_len (40)"), std::string::npos) << s.message();
  s = make_layout_for_length(fixed, 100, 64, &out);
  EXPECT_NE(s.message().find("seq_len (100)"), std::string::npos) << s.message();
}

TEST(SparsityValidation, ValidDefaultsPass) {
  for (const SparsityConfig& c : all_kinds()) {
    EXPECT_TRUE(validate_sparsity_config(c).ok()) << to_string(c);
  }
}

}  // namespace
}  // namespace sciattn
