// libFuzzer target: the sparsity configs and the layout and index builders, on configs whose every
// field comes from the input (any mode, block, count, index list and direction, in range or not).
// A config is either rejected with a message or builds; the dense route (make_layout, then
// build_block_sparse_index) and the config route (build_sparse_attention_index) must agree on the
// Status and, when both build, on the index. Test layer (tests/fuzz).
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_support.h"
#include "sciattn/block_sparse.h"

namespace {

using namespace sciattn;

// Mostly small values (the ones that build), sometimes anything.
int64_t pick(FuzzedDataProvider& in, int64_t lo, int64_t hi) {
  return in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(lo, hi)
                          : in.ConsumeIntegral<int64_t>();
}

std::vector<int64_t> pick_list(FuzzedDataProvider& in) {
  std::vector<int64_t> v(in.ConsumeIntegralInRange<size_t>(0, 4));
  for (int64_t& x : v) x = pick(in, -1, 12);
  return v;
}

AttentionDirection pick_direction(FuzzedDataProvider& in) {
  return in.ConsumeBool() ? AttentionDirection::kUnidirectional
                          : AttentionDirection::kBidirectional;
}

SparsityConfig make_config(FuzzedDataProvider& in) {
  const auto mode = static_cast<SparsityMode>(in.ConsumeIntegralInRange<int>(0, 5));
  SparsityConfig config = default_sparsity_config(mode, 1);
  SparsityCommon& common = sparsity_common(config);
  common.num_heads = pick(in, 1, 4);
  const int64_t blocks[] = {16, 32, 64, 128};
  common.block = in.ConsumeBool() ? blocks[in.ConsumeIntegralInRange<int>(0, 3)] : pick(in, 0, 200);
  common.seed = in.ConsumeIntegral<uint64_t>();
  if (auto* c = std::get_if<FixedSparsityConfig>(&config)) {
    c->different_layout_per_head = in.ConsumeBool();
    c->num_local_blocks = pick(in, 0, 8);
    c->num_global_blocks = pick(in, 0, 4);
    c->attention = pick_direction(in);
    c->horizontal_global_attention = in.ConsumeBool();
    c->num_different_global_patterns = pick(in, 0, 4);
  } else if (auto* v = std::get_if<VariableSparsityConfig>(&config)) {
    v->different_layout_per_head = in.ConsumeBool();
    v->num_random_blocks = pick(in, 0, 4);
    v->local_window_blocks = pick_list(in);
    v->global_block_indices = pick_list(in);
    if (in.ConsumeBool()) v->global_block_end_indices = pick_list(in);
    v->attention = pick_direction(in);
    v->horizontal_global_attention = in.ConsumeBool();
  } else if (auto* b = std::get_if<BigBirdSparsityConfig>(&config)) {
    b->different_layout_per_head = in.ConsumeBool();
    b->num_random_blocks = pick(in, 0, 4);
    b->num_sliding_window_blocks = pick(in, 0, 7);
    b->num_global_blocks = pick(in, 0, 4);
    b->attention = pick_direction(in);
  } else if (auto* l = std::get_if<BSLongformerSparsityConfig>(&config)) {
    l->different_layout_per_head = in.ConsumeBool();
    l->num_sliding_window_blocks = pick(in, 0, 7);
    l->global_block_indices = pick_list(in);
    if (in.ConsumeBool()) l->global_block_end_indices = pick_list(in);
    l->attention = pick_direction(in);
  } else if (auto* w = std::get_if<LocalSlidingWindowSparsityConfig>(&config)) {
    w->num_sliding_window_blocks = pick(in, 0, 7);
    w->attention = pick_direction(in);
  }
  return config;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const SparsityConfig config = make_config(in);
  const Status valid = validate_sparsity_config(config);
  if (!valid.ok()) {
    sciattn::fuzz::require(!valid.message().empty(), "a rejection without a message");
    return 0;
  }
  sciattn::fuzz::check_layout_and_indexes(config, in.ConsumeIntegralInRange<int64_t>(1, 24));
  return 0;
}
