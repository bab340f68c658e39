// Ulysses sequence parallelism on the thread-per-rank communicator: the model's forward and
// backward with each rank holding its slice of the sequence (2 and 4 ranks; learned and rotary
// positions, checkpointing and tiles, a layout that differs per head) against one rank on the
// whole sequence; whole training steps with sequence_parallel_size 2 and 4 and with 2 x 2
// data-parallel x sequence-parallel ranks, at ZeRO stages 0, 1 and 2, against one rank; the
// errors for sizes that do not divide; a checkpoint written with 2 ranks resumed on 1. Test layer
// (cpu).
//
// What is bitwise and what is not: every token's own arithmetic (LayerNorm, MLP, attention of a
// head over the whole sequence) is the same on a slice as on the whole sequence, but a weight's
// gradient sums its tokens' contributions, over token chunks on one rank and per slice and then
// over ranks with sequence parallelism: another association. So against one rank the gradients,
// losses and parameters are held to bounds stated at each check (rounding-level); ZeRO stages 1
// and 2 against stage 0 on the same ranks sum the same per-rank gradients in rank order, and are
// compared bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "process_temp_dir.h"
#include "sciattn/train/data.h"
#include "sciattn/train/plan.h"
#include "sciattn/train/thread_communicator.h"
#include "sciattn/train/trainer.h"
#include "train_test_util.h"

namespace sciattn::train {
namespace {

using namespace testing;

constexpr uint64_t kSeed = 9157;

// Four heads (so that 4 ranks each get one) of head dim 4, and 16 tokens (slices of 8 and 4).
GptConfig sp_config(PositionEncoding positions = PositionEncoding::kLearned, bool tied = true,
                    int64_t layers = 2, int64_t length = 16) {
  GptConfig c = tiny_config(positions, tied, length);
  c.n_heads = 4;
  c.n_layers = layers;
  return c;
}

struct ModelRun {
  double loss = 0.0;                       // summed over the ranks
  int64_t tokens = 0;                      // summed over the ranks
  std::vector<double> grads;               // summed over the ranks
  std::vector<std::vector<float>> ranks_;  // each rank's own gradients
};

// Two micro-batches of `batch` sequences on `sp` ranks (1: no group), each rank scaling its
// tokens' losses by 1 / (tokens of the whole micro-batch), so that the gradients summed over the
// ranks are the whole micro-batches' gradients.
ModelRun run_model(const GptConfig& c, int sp, const MemoryOptions& memory,
                   const SparsityConfig* sparse = nullptr, int64_t batch = 2, int64_t chunk = 4) {
  const size_t T = static_cast<size_t>(batch * c.sequence_length);
  ModelRun run;
  run.ranks_.resize(static_cast<size_t>(sp));
  std::vector<double> losses(static_cast<size_t>(sp), 0.0);
  std::vector<int64_t> tokens(static_cast<size_t>(sp), 0);
  const std::vector<Status> st = run_thread_ranks(sp, [&](Communicator& comm) {
    auto be = cpu_backend(chunk, 1);
    std::unique_ptr<GptModel> model;
    Status s = GptModel::create(c, sparse, batch, memory, be.get(), &model, nullptr,
                                sp > 1 ? &comm : nullptr);
    if (!s.ok()) return s;
    s = model->zero_grads();
    for (uint64_t micro = 0; s.ok() && micro < 2; ++micro) {
      const auto in = random_tokens(T, c.vocab_size, kSeed + micro);
      const auto tg = random_tokens(T, c.vocab_size, kSeed + 100 + micro);
      MicroBatchResult out;
      s = model->forward_backward(in.data(), tg.data(), 1.0f / static_cast<float>(T), &out);
      losses[static_cast<size_t>(comm.rank())] += out.loss_sum;
      tokens[static_cast<size_t>(comm.rank())] += out.tokens;
    }
    const float* g = model->grads();
    run.ranks_[static_cast<size_t>(comm.rank())].assign(g, g + model->layout().total);
    return s;
  });
  for (size_t r = 0; r < st.size(); ++r) EXPECT_TRUE(st[r].ok()) << st[r].to_string();
  run.grads.assign(run.ranks_[0].size(), 0.0);
  for (int r = 0; r < sp; ++r) {
    run.loss += losses[static_cast<size_t>(r)];
    run.tokens += tokens[static_cast<size_t>(r)];
    const std::vector<float>& g = run.ranks_[static_cast<size_t>(r)];
    for (size_t i = 0; i < g.size(); ++i) run.grads[i] += g[i];
  }
  return run;
}

// Slot by slot: max |sp - one| <= 2e-5 x the slot's max |one| (about 160 float ulps of its
// largest gradient: two fp32 sums of a few dozen tokens' contributions in other associations
// differ by a few ulps; a wrong slice, head or position shows as an error of order 1).
void expect_gradients_close(const ParameterLayout& layout, const std::vector<double>& sp,
                            const std::vector<double>& one, const std::string& what) {
  for (const TensorSlot& slot : layout.slots) {
    double err = 0.0, mean = 0.0, scale = 0.0;
    for (int64_t i = slot.offset; i < slot.offset + slot.numel; ++i) {
      const size_t k = static_cast<size_t>(i);
      err = std::max(err, std::fabs(sp[k] - one[k]));
      mean += std::fabs(sp[k] - one[k]) / static_cast<double>(slot.numel);
      scale = std::max(scale, std::fabs(one[k]));
    }
    EXPECT_GT(scale, 0.0) << what << ": " << slot.name << " has no gradient";
    EXPECT_LE(err, 2e-5 * scale) << what << ": " << slot.name << " max error " << err
                                 << ", mean error " << mean << ", max |one rank| " << scale;
  }
}

struct ModelCase {
  const char* name;
  PositionEncoding positions;
  bool tied;
  int64_t layers;
  // 0: none; 1: checkpointing (offloaded), MLP and LM-head tiles; 2: those and the attention
  // outputs kept (in the head split); 3: those and the last layer's attention outputs kept
  int techniques;
};

class SequenceParallelModel : public ::testing::TestWithParam<std::tuple<int, ModelCase>> {};

// The forward and backward with each rank on its slice equal one rank on the whole sequence:
// the summed losses and gradients; the token count splits evenly; a rank's learned-position
// gradients are in its slice's rows only. (The one-layer case is the attention layer between the
// embeddings and the head: its q, k, v and output gradients pass through both all-to-alls.)
TEST_P(SequenceParallelModel, GradientsEqualOneRankOnTheWholeSequence) {
  const int sp = std::get<0>(GetParam());
  const ModelCase mc = std::get<1>(GetParam());
  std::printf("seed %llu\n", static_cast<unsigned long long>(kSeed));
  const GptConfig c = sp_config(mc.positions, mc.tied, mc.layers);
  MemoryOptions memory;
  if (mc.techniques > 0) {
    memory.offload_checkpoints = true;
    memory.mlp_tile_tokens = 4;
    memory.lm_head_tile_tokens = 4;
    memory.keep_attention_layers = mc.techniques == 2 || mc.techniques == 4 ? kAllLayers
                                   : mc.techniques == 3                     ? 1
                                                                            : 0;
    memory.offload_attention_outputs = mc.techniques == 4;
  }
  const ModelRun one = run_model(c, 1, MemoryOptions{});  // the techniques change no bits
  const ModelRun par = run_model(c, sp, memory);
  EXPECT_EQ(par.tokens, one.tokens);
  EXPECT_NEAR(par.loss, one.loss, 1e-6 * one.loss);
  const ParameterLayout layout = gpt_parameter_layout(c);
  expect_gradients_close(layout, par.grads, one.grads, std::to_string(sp) + " ranks");
  if (const TensorSlot* wpe = layout.find("wpe")) {
    const int64_t C = c.d_model, slice = c.sequence_length / sp;
    for (int r = 0; r < sp; ++r) {
      const std::vector<float>& g = par.ranks_[static_cast<size_t>(r)];
      int64_t outside = 0, inside = 0;
      for (int64_t row = 0; row < wpe->shape[0]; ++row) {
        const bool mine = row >= r * slice && row < (r + 1) * slice;
        for (int64_t k = 0; k < C; ++k) {
          const float x = g[static_cast<size_t>(wpe->offset + row * C + k)];
          (mine ? inside : outside) += x != 0.0f;
        }
      }
      EXPECT_EQ(outside, 0) << "rank " << r << " has position gradients outside its slice";
      EXPECT_EQ(inside, slice * C) << "rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    RanksAndModels, SequenceParallelModel,
    ::testing::Combine(
        ::testing::Values(2, 4),
        ::testing::Values(ModelCase{"attention_layer", PositionEncoding::kLearned, true, 1, 0},
                          ModelCase{"learned", PositionEncoding::kLearned, true, 2, 0},
                          ModelCase{"rotary_untied", PositionEncoding::kRotary, false, 2, 0},
                          ModelCase{"rotary_techniques", PositionEncoding::kRotary, true, 2, 1},
                          ModelCase{"attention_kept", PositionEncoding::kLearned, false, 2, 2},
                          ModelCase{"attention_kept_last", PositionEncoding::kRotary, false, 2, 3},
                          ModelCase{"attention_kept_offloaded", PositionEncoding::kRotary, true, 3,
                                    4})),
    [](const ::testing::TestParamInfo<std::tuple<int, ModelCase>>& i) {
      return std::to_string(std::get<0>(i.param)) + "ranks_" + std::get<1>(i.param).name;
    });

// A layout that differs per head (BigBird's random blocks) is built on each rank for its heads
// only, and the result still equals one rank's, which builds all heads.
TEST(SequenceParallelModelSparse, PerHeadLayoutIsSlicedPerRank) {
  GptConfig c = sp_config(PositionEncoding::kLearned, true, 2, 64);
  c.max_position_embeddings = 64;
  BigBirdSparsityConfig bb;
  bb.block = 16;
  bb.different_layout_per_head = true;
  bb.num_random_blocks = 1;
  bb.num_sliding_window_blocks = 1;
  bb.num_global_blocks = 1;
  const SparsityConfig sparse = bb;
  AttentionPlan all, slice;
  ASSERT_TRUE(plan_attention(c, &sparse, &all).ok());
  ASSERT_TRUE(plan_attention(c, &sparse, &slice, 2, 2).ok());
  ASSERT_EQ(slice.index.num_heads, 2);
  ASSERT_EQ(all.index.layout_heads, 4);  // the heads' layouts differ: none is shared
  // The slice's blocks are those of heads 2 and 3 of the whole layout, in order.
  std::vector<std::vector<int64_t>> want, got;
  for (size_t p = 0; p < all.index.head.size(); ++p) {
    if (all.index.head[p] >= 2)
      want.push_back({all.index.head[p] - 2, all.index.row[p], all.index.col[p]});
  }
  for (size_t p = 0; p < slice.index.head.size(); ++p) {
    got.push_back({slice.index.head[p], slice.index.row[p], slice.index.col[p]});
  }
  EXPECT_EQ(got, want);
  EXPECT_FALSE(want.empty());
  const ModelRun one = run_model(c, 1, MemoryOptions{}, &sparse, 1);
  for (int sp : {2, 4}) {
    const ModelRun par = run_model(c, sp, MemoryOptions{}, &sparse, 1);
    EXPECT_NEAR(par.loss, one.loss, 1e-6 * one.loss) << sp << " ranks";
    expect_gradients_close(gpt_parameter_layout(c), par.grads, one.grads,
                           "bigbird, " + std::to_string(sp) + " ranks");
  }
}

// Sizes that do not divide are refused by name: the model's heads and length (the world size
// and the config's heads are checked when the config is parsed, test_train_config), and a head
// range outside the model.
TEST(SequenceParallelModelErrors, UnevenSizesNameTheKey) {
  const std::vector<Status> st = run_thread_ranks(3, [](Communicator& comm) {
    auto be = cpu_backend(4, 1);
    std::unique_ptr<GptModel> model;
    Status s = GptModel::create(sp_config(), nullptr, 1, MemoryOptions{}, be.get(), &model, nullptr,
                                &comm);
    EXPECT_NE(s.message().find("sequence_parallel_size 3 does not divide the model's n_heads 4"),
              std::string::npos)
        << s.message();
    return Status::ok_status();
  });
  for (const Status& s : st) EXPECT_TRUE(s.ok()) << s.to_string();
  Status s = check_sequence_parallel(sp_config(PositionEncoding::kLearned, true, 2, 18), 4);
  EXPECT_NE(s.message().find("sequence_parallel_size 4 does not divide the model's "
                             "sequence_length 18"),
            std::string::npos)
      << s.message();
  EXPECT_TRUE(check_sequence_parallel(sp_config(PositionEncoding::kLearned, true, 2, 18), 2).ok());
  AttentionPlan plan;
  s = plan_attention(sp_config(), nullptr, &plan, 3, 2);
  EXPECT_NE(s.message().find("heads [3, 5) are not within the model's n_heads 4"),
            std::string::npos)
      << s.message();
}

// The layout copy's argument checks (backend.h's check_strided_copy, which the CUDA back end
// shares): each refusal names what is wrong.
TEST(SequenceParallelModelErrors, StridedCopyRefusesBadViews) {
  auto be = cpu_backend(4, 1);
  std::vector<float> a(24), b(24);
  const TensorView src = TensorView::contiguous(a.data(), DType::kF32, {2, 3, 4}, Device::kCpu);
  const TensorView dst = TensorView::contiguous(b.data(), DType::kF32, {2, 3, 4}, Device::kCpu);
  auto message = [&](const TensorView& s, const TensorView& d) {
    const Status st = be->strided_copy({s, d});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    return st.message();
  };
  EXPECT_TRUE(be->strided_copy({src, dst}).ok());
  EXPECT_NE(message(TensorView{}, dst).find("src and dst must be present"), std::string::npos);
  TensorView on_gpu = dst;
  on_gpu.device = Device::kCuda;
  EXPECT_NE(message(src, on_gpu).find("src and dst must be in host memory"), std::string::npos);
  const std::string sizes =
      message(src, TensorView::contiguous(b.data(), DType::kF32, {2, 4, 3}, Device::kCpu));
  EXPECT_NE(sizes.find("dst must have src's sizes and dtype (rank 1 to 6); got src [2, 3, 4] f32, "
                       "dst [2, 4, 3] f32"),
            std::string::npos)
      << sizes;
  const std::string dtype =
      message(src, TensorView::contiguous(b.data(), DType::kBF16, {2, 3, 4}, Device::kCpu));
  EXPECT_NE(dtype.find("dst [2, 3, 4] bf16"), std::string::npos) << dtype;
  TensorView rank0 = src;
  rank0.rank = 0;
  EXPECT_NE(message(rank0, rank0).find("rank 1 to 6"), std::string::npos);
}

// The memory plan of one rank of a group equals that rank's model's ledger, and every per-token
// buffer shrinks: a rank of 2 holds less than one rank on the whole sequence.
TEST(SequenceParallelModelMemory, PlanEqualsTheLedgerAndShrinks) {
  const GptConfig c = sp_config(PositionEncoding::kLearned, true, 2, 64);
  MemoryOptions m;
  m.checkpoint_layers = true;
  MemoryLedger one;
  ASSERT_TRUE(plan_gpt_memory(c, nullptr, 2, m, DType::kF32, 4, Device::kCpu, &one).ok());
  std::vector<std::string> reports(2);
  const std::vector<Status> st = run_thread_ranks(2, [&](Communicator& comm) {
    auto be = cpu_backend(4, 1);
    std::unique_ptr<GptModel> model;
    Status s = GptModel::create(c, nullptr, 2, m, be.get(), &model, nullptr, &comm);
    if (s.ok()) reports[static_cast<size_t>(comm.rank())] = model->ledger().report();
    return s;
  });
  for (const Status& s : st) ASSERT_TRUE(s.ok()) << s.to_string();
  MemoryLedger plan;
  ASSERT_TRUE(plan_gpt_memory(c, nullptr, 2, m, DType::kF32, 4, Device::kCpu, &plan, 2).ok());
  EXPECT_EQ(plan.report(), reports[0]);
  EXPECT_EQ(reports[1], reports[0]);
  // Activations: all but the model states (weights and gradients, the same on every rank).
  auto activations = [](const MemoryLedger& l) {
    uint64_t bytes = 0;
    for (const LedgerEntry& e : l.entries()) bytes += e.category != "model states" ? e.bytes : 0;
    return bytes;
  };
  EXPECT_LT(activations(plan), activations(one) * 3 / 4) << plan.report() << "\n" << one.report();
}

// The training plan (plan_training_memory, what `sciattn train --plan --nproc-per-node N` prints)
// with sequence_parallel_size 2 is one rank's memory with the sequence split, against sizes
// derived here from the model: a layer's activations hold T = B L / 2 tokens plus the head-split
// attention output and the lse of n_heads / 2 heads over the whole sequence; the two all-to-all
// buffers hold [T, 3C] each; the back end's attention scratch is dq, dk, dv over the whole
// sequence for C / 2 channels; the attention index is one head's (dense causal); and every
// per-token entry is half of one rank's.
TEST(SequenceParallelModelMemory, TrainingPlanIsOneRanksShareOfTheSequence) {
  const GptConfig c = sp_config(PositionEncoding::kRotary, true, 2, 4096);
  PlanInput in;
  in.model = c;
  in.micro_batch = 2;
  in.compute_dtype = DType::kBF16;
  in.device = Device::kCuda;  // planned only: nothing is allocated
  in.world_size = 2;
  in.sequence_parallel_size = 2;
  MemoryPlan two, one;
  ASSERT_TRUE(plan_training_memory(in, &two).ok());
  PlanInput single = in;
  single.world_size = 1;
  single.sequence_parallel_size = 1;
  ASSERT_TRUE(plan_training_memory(single, &one).ok());
  auto bytes_of = [](const MemoryPlan& p, const std::string& prefix) -> uint64_t {
    for (const LedgerEntry& e : p.ledger.entries()) {
      if (e.name.rfind(prefix, 0) == 0) return e.bytes;
    }
    ADD_FAILURE() << "no entry '" << prefix << "' in\n" << p.ledger.report();
    return 0;
  };
  // B 2, L 4096 (dense causal: blocks of 64, no padding), C 16, F 64, 4 heads, bf16.
  const uint64_t B = 2, L = 4096, C = 16, F = 64, H = 4, S = 2, es = 2, f4 = 4;
  const uint64_t T = B * L / S;
  const uint64_t layer = T * C * es        // ln1
                         + 2 * T * f4      // its mean and rstd
                         + 3 * T * C * es  // qkv (the head split: every token, half the heads)
                         + 2 * T * C * es  // attention output, token split and head split
                         + B * (H / S) * L * f4  // lse of the rank's heads over the sequence
                         + 2 * T * C * es        // r2, ln2
                         + 2 * T * f4            // ln2's mean and rstd
                         + 2 * T * F * es;       // the MLP's pre- and post-GELU values
  EXPECT_EQ(bytes_of(two, "layer 0 activations"), layer);
  EXPECT_EQ(bytes_of(two, "layer 1 activations"), layer);
  EXPECT_EQ(bytes_of(two, "sequence-parallel all-to-all buffers"), 2 * 3 * T * C * es);
  // dq, dk, dv [B, L, C/S] (larger than the embedding sort's 24 bytes x T).
  EXPECT_EQ(bytes_of(two, "back end: scratch"), 3 * B * L * (C / S) * es);
  const uint64_t blocks = (L / 64) * (L / 64 + 1) / 2;
  EXPECT_EQ(bytes_of(two, "attention index (" + std::to_string(blocks) + " stored blocks)"),
            40 * blocks);
  EXPECT_EQ(bytes_of(two, "LM-head logits [T, V]"), T * static_cast<uint64_t>(c.vocab_size) * es);
  EXPECT_EQ(bytes_of(two, "final LayerNorm and losses"), T * C * es + 3 * T * f4);
  // One rank on the whole sequence: twice the per-token entries, no all-to-all.
  EXPECT_EQ(2 * bytes_of(two, "LM-head logits [T, V]"), bytes_of(one, "LM-head logits [T, V]"));
  EXPECT_EQ(2 * bytes_of(two, "back end: scratch"), bytes_of(one, "back end: scratch"));
  EXPECT_LT(two.device_bytes, one.device_bytes);
  EXPECT_EQ(one.ledger.report().find("all-to-all"), std::string::npos);

  // Refused: a group size that does not divide the ranks, and a search granularity that is not a
  // whole number of slices.
  PlanInput bad = in;
  bad.sequence_parallel_size = 4;
  bad.world_size = 2;
  MemoryPlan p;
  Status st = plan_training_memory(bad, &p);
  EXPECT_NE(st.message().find("sequence_parallel_size 4 must be >= 1 and divide the ranks planned "
                              "for (2)"),
            std::string::npos)
      << st.message();
  int64_t longest = 0;
  st = longest_sequence(in, uint64_t{1} << 40, uint64_t{1} << 40, 63, 630, &longest);
  EXPECT_NE(st.message().find("granularity 63 must be a multiple of sequence_parallel_size 2"),
            std::string::npos)
      << st.message();
  // The search runs on the split: a budget of this plan's bytes fits 4096 tokens, not more.
  ASSERT_TRUE(longest_sequence(in, two.device_bytes, two.host_bytes, 64, 8192, &longest).ok());
  EXPECT_EQ(longest, 4096);
}

// ---- whole training steps ----

const TokenFile& shared_data() {
  static std::unique_ptr<TokenFile> file = [] {
    std::vector<std::vector<int32_t>> docs;
    const std::vector<int32_t> noise = random_tokens(16 * 40, 36, kSeed);
    for (size_t d = 0; d < 16; ++d) {
      std::vector<int32_t> doc = {noise[d * 40]};
      for (size_t i = 1; i < 37; ++i) {
        doc.push_back(noise[d * 40 + i] % 5 == 0 ? noise[d * 40 + i] : (5 * doc.back() + 2) % 36);
      }
      docs.push_back(doc);
    }
    const std::string path = sciattn::testing::process_temp_dir() + "sequence_parallel.tok";
    EXPECT_TRUE(write_token_file(path, docs, 37, 36, Tokenizer::kUnspecified).ok());
    std::unique_ptr<TokenFile> f;
    EXPECT_TRUE(TokenFile::open(path, &f).ok());
    std::remove(path.c_str());  // the mapping outlives the name
    return f;
  }();
  return *file;
}

// `world` ranks in groups of `sp`, `gas` micro-batches of 1 sequence per data-parallel rank.
std::string config_json(int world, int sp, int gas, int stage) {
  return "{\"train_batch_size\": " + std::to_string(world / sp * gas) +
         ", \"train_micro_batch_size_per_gpu\": 1, \"sequence_parallel_size\": " +
         std::to_string(sp) +
         ", \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-3, \"weight_decay\": "
         "0.1}}, \"gradient_clipping\": 1.0, \"zero_optimization\": {\"stage\": " +
         std::to_string(stage) + "}}";
}

Status make_trainer(const GptConfig& model, const std::string& json, Communicator& comm,
                    std::unique_ptr<Trainer>* out) {
  AutoValues autos;
  autos.world_size = comm.world_size();
  TrainConfig config;
  std::vector<std::string> warnings;
  Status s = parse_train_config(json, "\"sp test\"", model.n_heads, autos, &config, &warnings);
  if (!s.ok()) return s;
  TrainerOptions o;
  o.token_chunk = 4;
  o.threads = 1;
  o.communicator = &comm;
  std::unique_ptr<Backend> be;
  CpuBackendOptions bo;
  bo.token_chunk = 4;
  bo.threads = 1;
  s = make_cpu_backend(bo, &be);
  if (!s.ok()) return s;
  return Trainer::create(model, config, o, std::move(be), &shared_data(), out);
}

struct TrainRun {
  std::vector<float> params;  // rank 0's master weights, unpadded
  std::vector<StepReport> reports;
  std::vector<float> loaded;  // after a load (ResumeOnOneRank)
};

// Trains `steps` steps on `world` ranks; the first `save_after` (> 0) saves to `save` then.
TrainRun train(const GptConfig& model, int world, int sp, int gas, int stage, int steps,
               const std::string& save = "", int save_after = 0) {
  TrainRun run;
  const int64_t n = gpt_parameter_layout(model).total;
  const std::vector<Status> st = run_thread_ranks(world, [&](Communicator& comm) {
    std::unique_ptr<Trainer> t;
    Status s = make_trainer(model, config_json(world, sp, gas, stage), comm, &t);
    for (int k = 0; s.ok() && k < steps; ++k) {
      StepReport rep;
      s = t->step(&rep);
      if (comm.rank() == 0) run.reports.push_back(rep);
      if (s.ok() && k + 1 == save_after) s = t->save_checkpoint(save);
    }
    std::vector<float> p;
    if (s.ok()) s = t->master_parameters(&p);
    if (s.ok() && comm.rank() == 0) run.params.assign(p.begin(), p.begin() + n);
    return s;
  });
  for (size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
  return run;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return a.size() == b.size() ? m : INFINITY;
}

// One rank with the same global batches: every data-parallel rank's micro-batches in a row.
// Bounds: losses to 1e-6 relative (sums of the same per-token losses in double, from gradients
// that differ at rounding level), parameters to 1% of what AdamW moves a parameter in a step
// (lr = 3e-3), as for ZeRO against one rank (rounding-level gradient differences change an update
// visibly only where the gradient is itself near rounding level).
void expect_equals_one_rank(const TrainRun& par, const TrainRun& one, const std::string& what) {
  ASSERT_EQ(par.reports.size(), one.reports.size()) << what;
  for (size_t k = 0; k < one.reports.size(); ++k) {
    EXPECT_EQ(par.reports[k].tokens, one.reports[k].tokens) << what;
    EXPECT_NEAR(par.reports[k].loss, one.reports[k].loss, 1e-6 * one.reports[k].loss)
        << what << ", step " << k + 1;
    EXPECT_NEAR(par.reports[k].grad_norm, one.reports[k].grad_norm, 1e-5 * one.reports[k].grad_norm)
        << what << ", step " << k + 1;
  }
  const double diff = max_abs_diff(par.params, one.params);
  std::printf("%s: parameters after %zu steps differ from one rank's by %.3g\n", what.c_str(),
              one.reports.size(), diff);
  EXPECT_LT(diff, 1e-2 * 3e-3) << what;
  // And training happened: the parameters moved and the loss fell.
  EXPECT_GT(max_abs_diff(one.params, std::vector<float>(one.params.size(), 0.0f)), 0.0);
  EXPECT_LT(one.reports.back().loss, one.reports.front().loss) << what;
}

class SequenceParallelTraining : public ::testing::TestWithParam<std::tuple<int, int>> {};

// K = 4 steps with sequence parallelism (world, group) = (2, 2), (4, 4), (4, 2): 2 data-parallel
// x 2 sequence-parallel) at ZeRO stages 0, 1 and 2 equal one rank; stages 1 and 2 equal stage 0
// on the same ranks bit for bit.
TEST_P(SequenceParallelTraining, StepsEqualOneRank) {
  const int world = std::get<0>(GetParam()), sp = std::get<1>(GetParam());
  const int dp = world / sp, steps = 4;
  for (PositionEncoding pos : {PositionEncoding::kLearned, PositionEncoding::kRotary}) {
    const GptConfig model = sp_config(pos);
    const std::string what =
        std::to_string(dp) + " x " + std::to_string(sp) + " ranks, " + position_encoding_name(pos);
    const TrainRun one = train(model, 1, 1, dp, 0, steps);
    const TrainRun base = train(model, world, sp, 1, 0, steps);
    expect_equals_one_rank(base, one, what + ", stage 0");
    for (int stage : {1, 2}) {
      const TrainRun z = train(model, world, sp, 1, stage, steps);
      EXPECT_EQ(max_abs_diff(z.params, base.params), 0.0) << what << ", stage " << stage;
      for (size_t k = 0; k < z.reports.size(); ++k) {
        EXPECT_EQ(z.reports[k].loss, base.reports[k].loss) << what << ", stage " << stage;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldAndGroup, SequenceParallelTraining,
                         ::testing::Values(std::make_tuple(2, 2), std::make_tuple(4, 4),
                                           std::make_tuple(4, 2)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& i) {
                           return "world" + std::to_string(std::get<0>(i.param)) + "_sp" +
                                  std::to_string(std::get<1>(i.param));
                         });

// Two micro-batches per data-parallel rank (accumulation inside a sequence-parallel rank) with
// stage 2 (buckets reduced per micro-batch) still equals one rank.
TEST(SequenceParallelTrainingMore, AccumulationWithStageTwo) {
  const GptConfig model = sp_config();
  const TrainRun one = train(model, 1, 1, 4, 0, 3);
  expect_equals_one_rank(train(model, 4, 2, 2, 2, 3), one, "2 x 2 ranks, 2 micro-batches, stage 2");
}

// A model whose length the group does not divide is refused when the trainer is built, on every
// rank, naming the key; so is a config parsed for another world size.
TEST(SequenceParallelTrainingMore, UnevenLengthIsRefused) {
  const std::vector<Status> st = run_thread_ranks(2, [](Communicator& comm) {
    std::unique_ptr<Trainer> t;
    return make_trainer(sp_config(PositionEncoding::kLearned, true, 2, 15), config_json(2, 2, 1, 0),
                        comm, &t);
  });
  for (const Status& s : st) {
    EXPECT_NE(s.message().find("sequence_parallel_size 2 does not divide the model's "
                               "sequence_length 15"),
              std::string::npos)
        << s.message();
  }
}

// A checkpoint written by 2 ranks of one sequence-parallel group (ZeRO stage 1) loads on one
// rank: the loaded weights are the saved ones bit for bit, and the step after it equals the
// 2-rank run's next step within the bounds above.
TEST(SequenceParallelTrainingMore, CheckpointResumesOnOneRank) {
  const GptConfig model = sp_config(PositionEncoding::kRotary);
  const std::string dir = sciattn::testing::process_temp_dir() + "sp_ckpt";
  std::filesystem::remove_all(dir);
  const TrainRun saved = train(model, 2, 2, 1, 1, 2, dir, 2);  // save after step 2
  const TrainRun further = train(model, 2, 2, 1, 1, 3);        // the same run, one step more
  TrainRun resumed;
  const std::vector<Status> st = run_thread_ranks(1, [&](Communicator& comm) {
    std::unique_ptr<Trainer> t;
    Status s = make_trainer(model, config_json(1, 1, 1, 0), comm, &t);
    if (s.ok()) s = t->load_checkpoint(dir);
    if (s.ok()) s = t->master_parameters(&resumed.loaded);
    StepReport rep;
    if (s.ok()) s = t->step(&rep);
    resumed.reports.push_back(rep);
    if (s.ok()) s = t->master_parameters(&resumed.params);
    EXPECT_EQ(t == nullptr ? -1 : t->global_step(), 3);
    return s;
  });
  ASSERT_TRUE(st[0].ok()) << st[0].to_string();
  EXPECT_EQ(max_abs_diff(resumed.loaded, saved.params), 0.0);
  ASSERT_EQ(further.reports.size(), 3u);
  EXPECT_NEAR(resumed.reports[0].loss, further.reports[2].loss, 1e-6 * further.reports[2].loss);
  EXPECT_LT(max_abs_diff(resumed.params, further.params), 1e-2 * 3e-3);
  EXPECT_GT(max_abs_diff(resumed.params, saved.params), 0.0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sciattn::train
