// ZeRO stages 1 and 2 on the thread-per-rank communicator: a tiny GPT trained on 2 and 4 ranks
// (each rank its own micro-batches) against the replicated data-parallel trainer (stage 0) and
// against one rank with gradient accumulation over the same micro-batches; bucket sizes and the
// communication switches; clipping from shards; ds_enhanced overflow on one rank; refusals;
// checkpoint folders saved on N ranks and resumed on N, on another number of ranks or on one;
// ranks as processes (the TCP test communicator) against ranks as threads.
// Test layer (cpu).
//
// Which comparisons are bitwise, and why:
//   - ZeRO-1 / ZeRO-2 vs stage 0 on the same ranks: every path sums the same per-rank fp32
//     gradients in rank order and AdamW is elementwise, so the parameters are equal bit for bit
//     (ZeRO-2 with several micro-batches per rank excepted: it reduces each micro-batch and adds
//     the results, DeepSpeed's order, where the others add the micro-batches first).
//   - Bucket size, reduce_scatter and allgather_partitions change which calls move the data, not
//     the arithmetic: bitwise.
//   - Against one rank with accumulation: not bitwise. One rank adds micro-batch k's gradient
//     into the buffer inside the layers (a LayerNorm row at a time, a token chunk at a time), so
//     its additions associate differently. The reduced gradients are held to the tolerance rule
//     of the conventions against an fp64 oracle (the same micro-batch gradients summed in
//     double); the parameters after K steps to a bound stated at the check.
//   - Norms from shards (all_reduce_sum of per-rank sums of squares, in double) associate
//     differently from one sum over the whole buffer: equal to 1e-12 relative.
//   - Checkpoints: save on N ranks and resume on the same N continues bit for bit. Resumed on
//     another N' (or from / to one rank, or at another stage), the state after the load is the
//     saved state bit for bit; the steps after it reduce in another association (each rank
//     accumulates its micro-batches inside the layers before the mean over ranks), so they are
//     held to the bound of the accumulation tests; stage 0 -> stage 1 on the same N is bitwise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "process_ranks.h"
#include "process_temp_dir.h"
#include "sciattn/train/data.h"
#include "sciattn/train/plan.h"
#include "sciattn/train/process_group.h"
#include "sciattn/train/thread_communicator.h"
#include "sciattn/train/trainer.h"
#include "sciattn/train/zero.h"
#include "train_test_util.h"

namespace sciattn::train {
namespace {

using namespace testing;

constexpr uint64_t kDataSeed = 4242;

// Documents over a vocabulary of 37 (separator 36) with a learnable successor rule.
std::unique_ptr<TokenFile> data_file(int documents) {
  std::vector<std::vector<int32_t>> docs;
  std::vector<int32_t> noise = random_tokens(static_cast<size_t>(documents) * 40, 36, kDataSeed);
  size_t k = 0;
  for (int d = 0; d < documents; ++d) {
    std::vector<int32_t> doc = {noise[k++] % 36};
    for (int i = 0; i < 30; ++i) {
      const int32_t next = (3 * doc.back() + 1) % 36;
      doc.push_back(noise[k++] % 7 == 0 ? noise[k] % 36 : next);
    }
    docs.push_back(doc);
  }
  const std::string path =
      sciattn::testing::process_temp_dir() + "zero_" + std::to_string(documents) + ".tok";
  EXPECT_TRUE(write_token_file(path, docs, 37, 36, Tokenizer::kUnspecified).ok());
  std::unique_ptr<TokenFile> f;
  EXPECT_TRUE(TokenFile::open(path, &f).ok());
  std::remove(path.c_str());  // the mapping outlives the name
  return f;
}

// The tiny GPT of the other trainer tests with 16 learned positions, so that its layout holds an
// odd number of 16-element blocks and must be padded for 2 and for 4 ranks.
GptConfig zero_config() {
  GptConfig g = tiny_config();
  g.max_position_embeddings = 16;
  return g;
}

const TokenFile& shared_data() {
  static std::unique_ptr<TokenFile> f = data_file(12);
  return *f;
}

// The DeepSpeed config for `world` ranks: micro-batch 1, `gas` micro-batches per rank, AdamW
// with weight decay, ZeRO `stage` and extra zero_optimization keys, and `extra` top-level keys.
std::string config_json(int world, int gas, int stage, const std::string& zero_keys = "",
                        const std::string& extra = "") {
  return "{\"train_batch_size\": " + std::to_string(world * gas) +
         ", \"train_micro_batch_size_per_gpu\": 1,"
         " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-3, \"betas\": [0.9, 0.95],"
         " \"weight_decay\": 0.1}},"
         " \"zero_optimization\": {\"stage\": " +
         std::to_string(stage) + zero_keys + "}" + extra + "}";
}

TrainConfig parse(const std::string& json, int world) {
  AutoValues autos;
  autos.world_size = world;
  TrainConfig c;
  std::vector<std::string> warnings;
  Status s = parse_train_config(json, "\"zero test\"", 2, autos, &c, &warnings);
  EXPECT_TRUE(s.ok()) << s.to_string() << "\n" << json;
  return c;
}

Status make_trainer(const TrainConfig& c, Communicator* comm, TrainerOptions o,
                    std::unique_ptr<Trainer>* out, const GptConfig& model = zero_config()) {
  o.token_chunk = 8;
  o.threads = 1;  // the ranks are threads already
  o.communicator = comm;
  std::unique_ptr<Backend> be;
  CpuBackendOptions bo;
  bo.token_chunk = o.token_chunk;
  bo.threads = 1;
  Status s = make_cpu_backend(bo, &be);
  if (!s.ok()) return s;
  return Trainer::create(model, c, o, std::move(be), &shared_data(), out);
}

// What each rank ends with.
struct RankRuns {
  std::vector<std::vector<float>> params;  // per rank: the master weights (layout total)
  std::vector<std::vector<StepReport>> reports;
  std::vector<std::vector<float>> exp_avg;    // per rank: its ZeRO shard of m (empty: stage 0)
  std::vector<std::vector<float>> gradients;  // per rank: the last step's reduced gradients
                                              // (ZeRO: its shard; otherwise all of them)
  std::vector<int64_t> shard_begin, buckets;
  std::vector<int64_t> in_flight;  // per rank: ZeroOptimizer::max_in_flight_last_step
  int64_t total = 0;
  std::vector<MemoryLedger> ledgers;
};

using OptionsFn = std::function<void(int rank, TrainerOptions*)>;

RankRuns train(int world, const std::string& json, int steps, const OptionsFn& options = {},
               const GptConfig& model = zero_config()) {
  const TrainConfig c = parse(json, world);
  RankRuns run;
  run.params.resize(static_cast<size_t>(world));
  run.reports.resize(static_cast<size_t>(world));
  run.exp_avg.resize(static_cast<size_t>(world));
  run.gradients.resize(static_cast<size_t>(world));
  run.shard_begin.assign(static_cast<size_t>(world), 0);
  run.buckets.assign(static_cast<size_t>(world), 0);
  run.in_flight.assign(static_cast<size_t>(world), 0);
  run.ledgers.resize(static_cast<size_t>(world));
  const std::vector<Status> st = run_thread_ranks(world, [&](Communicator& comm) {
    const size_t r = static_cast<size_t>(comm.rank());
    TrainerOptions o;
    if (options) options(comm.rank(), &o);
    std::unique_ptr<Trainer> t;
    Status s = make_trainer(c, &comm, o, &t, model);
    if (!s.ok()) return s;
    for (int k = 0; k < steps; ++k) {
      StepReport rep;
      s = t->step(&rep);
      if (!s.ok()) return s;
      run.reports[r].push_back(rep);
    }
    s = t->master_parameters(&run.params[r]);
    if (!s.ok()) return s;
    if (comm.rank() == 0) run.total = t->model().layout().total;
    run.ledgers[r] = t->ledger();
    if (ZeroOptimizer* z = t->zero()) {
      run.shard_begin[r] = z->shard_begin();
      run.buckets[r] = z->buckets_last_step();
      run.in_flight[r] = z->max_in_flight_last_step();
      s = z->shard_to_host(ZeroOptimizer::State::kExpAvg, &run.exp_avg[r]);
      if (!s.ok()) return s;
      return z->shard_to_host(ZeroOptimizer::State::kGradients, &run.gradients[r]);
    }
    run.gradients[r].resize(static_cast<size_t>(t->model().layout().total));
    return t->backend().copy_to_host(run.gradients[r].data(), t->model().grads(),
                                     run.gradients[r].size() * sizeof(float));
  });
  for (size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
  return run;
}

// The real parameters (the layout without ZeRO's padding at the end).
int64_t unpadded_total() {
  return gpt_parameter_layout(zero_config()).total;
}

bool same_prefix(const std::vector<float>& a, const std::vector<float>& b, int64_t n) {
  return a.size() >= static_cast<size_t>(n) && b.size() >= static_cast<size_t>(n) &&
         bitwise_equal(a.data(), b.data(), static_cast<size_t>(n));
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    m = std::max(
        m, std::fabs(static_cast<double>(a[static_cast<size_t>(i)]) - b[static_cast<size_t>(i)]));
  }
  return m;
}

// The tests must not pass by doing nothing: most parameters moved from their initialisation,
// every rank holds the same parameters, and the ranks' shards of m differ and are not zero.
void expect_real_training(const RankRuns& run, int world) {
  const int64_t n = unpadded_total();
  std::vector<float> init(static_cast<size_t>(n));
  init_gpt_parameters(zero_config(), gpt_parameter_layout(zero_config()), init.data());
  int64_t moved = 0;
  for (int64_t i = 0; i < n; ++i)
    moved += run.params[0][static_cast<size_t>(i)] != init[static_cast<size_t>(i)];
  EXPECT_GT(moved, gpt_parameter_layout(zero_config()).parameter_count() * 9 / 10);
  for (int r = 1; r < world; ++r) {
    EXPECT_TRUE(same_prefix(run.params[0], run.params[static_cast<size_t>(r)], run.total))
        << "rank " << r << " holds other parameters than rank 0";
  }
  if (run.exp_avg[0].empty()) return;
  for (int r = 0; r < world; ++r) {
    const std::vector<float>& m = run.exp_avg[static_cast<size_t>(r)];
    EXPECT_EQ(static_cast<int64_t>(m.size()) * world, run.total);
    EXPECT_EQ(run.shard_begin[static_cast<size_t>(r)], static_cast<int64_t>(m.size()) * r);
    EXPECT_TRUE(std::any_of(m.begin(), m.end(), [](float x) { return x != 0.0f; }))
        << "rank " << r << "'s shard of m is all zeros";
    if (r > 0) {
      EXPECT_FALSE(m == run.exp_avg[static_cast<size_t>(r - 1)]);
    }
  }
}

class ZeroStages : public ::testing::TestWithParam<int> {};  // the world size

// ZeRO-1 and ZeRO-2 equal the replicated data-parallel trainer bit for bit (one micro-batch per
// rank), and the layout is padded when it does not split evenly.
TEST_P(ZeroStages, EqualReplicatedDataParallelBitwise) {
  const int world = GetParam();
  const int steps = 3;
  const RankRuns base = train(world, config_json(world, 1, 0), steps);
  expect_real_training(base, world);
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const RankRuns z = train(world, config_json(world, 1, stage), steps);
    expect_real_training(z, world);
    EXPECT_EQ(z.total % (world * kSlotAlign), 0);
    EXPECT_GT(z.total, unpadded_total());  // the shards are padded
    EXPECT_TRUE(same_prefix(z.params[0], base.params[0], unpadded_total()))
        << "max |diff| " << max_abs_diff(z.params[0], base.params[0], unpadded_total());
    // The padding stays zero.
    for (int64_t i = unpadded_total(); i < z.total; ++i) {
      EXPECT_EQ(z.params[0][static_cast<size_t>(i)], 0.0f);
    }
    for (int k = 0; k < steps; ++k) {
      const StepReport &a = z.reports[0][static_cast<size_t>(k)],
                       &b = base.reports[0][static_cast<size_t>(k)];
      EXPECT_EQ(a.loss, b.loss);  // the global batch's mean loss, on every rank
      EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-12 * b.grad_norm);
      EXPECT_EQ(a.tokens, b.tokens);
      for (int r = 1; r < world; ++r) {
        EXPECT_EQ(z.reports[static_cast<size_t>(r)][static_cast<size_t>(k)].grad_norm, a.grad_norm);
      }
    }
    // The shards of the reduced gradients are stage 0's gradients, piece by piece.
    for (int r = 0; r < world; ++r) {
      const std::vector<float>& g = z.gradients[static_cast<size_t>(r)];
      EXPECT_TRUE(bitwise_equal(
          g.data(), base.gradients[0].data() + z.shard_begin[static_cast<size_t>(r)],
          std::min(g.size(), base.gradients[0].size() -
                                 static_cast<size_t>(z.shard_begin[static_cast<size_t>(r)]))))
          << "rank " << r;
    }
  }
}

// With two micro-batches per rank, ZeRO-1 still equals stage 0 bit for bit; ZeRO-2 adds the
// reduced micro-batches (another association): held to the oracle rule below instead.
TEST_P(ZeroStages, AccumulationOnEachRank) {
  const int world = GetParam();
  const RankRuns base = train(world, config_json(world, 2, 0), 2);
  const RankRuns z1 = train(world, config_json(world, 2, 1), 2);
  expect_real_training(z1, world);
  EXPECT_TRUE(same_prefix(z1.params[0], base.params[0], unpadded_total()));
  const RankRuns z2 = train(world, config_json(world, 2, 2), 2);
  expect_real_training(z2, world);
  // Two micro-batches per rank: stage 2 reduced each micro-batch's buckets.
  EXPECT_GE(z2.buckets[0], 2);
  const double diff = max_abs_diff(z2.params[0], base.params[0], unpadded_total());
  std::printf("ZeRO-2 vs stage 0, 2 micro-batches per rank, %d ranks: max |diff| %.3g\n", world,
              diff);
  // AdamW moves a parameter by about lr per step whatever its gradient; rounding-level gradient
  // differences stay below 1% of that (see ReducedGradientsMeetTheToleranceRule).
  EXPECT_LT(diff, 1e-2 * 3e-3);
}

// The reduced gradients against an fp64 oracle (the conventions' tolerance rule): out = ZeRO's
// reduced gradients (the shards put together), lowp_ref = one rank accumulating the same
// micro-batches, ref64 = the same per-micro-batch fp32 gradients summed in double.
TEST_P(ZeroStages, ReducedGradientsMeetTheToleranceRule) {
  const int world = GetParam();
  for (int gas : {1, 2}) {
    for (int stage : {1, 2}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + ", accumulation " + std::to_string(gas));
      const RankRuns z = train(world, config_json(world, gas, stage), 1);
      const RankRuns one = train(1, config_json(1, gas * world, 0), 1);
      std::vector<float> out;
      for (int r = 0; r < world; ++r) {
        out.insert(out.end(), z.gradients[static_cast<size_t>(r)].begin(),
                   z.gradients[static_cast<size_t>(r)].end());
      }
      // The oracle: every micro-batch of the global batch alone, in the loader's order, with the
      // grad_scale a rank uses (1 / (tokens x gas)); summed in double and divided by the ranks.
      const GptConfig g = zero_config();
      const ParameterLayout layout = gpt_parameter_layout(g);
      std::vector<float> init(static_cast<size_t>(layout.total));
      init_gpt_parameters(g, layout, init.data());
      std::unique_ptr<Backend> be = cpu_backend(8, 1);
      std::unique_ptr<GptModel> model;
      ASSERT_TRUE(
          GptModel::create(g, nullptr, 1, MemoryOptions{}, be.get(), &model, init.data()).ok());
      std::unique_ptr<DataLoader> loader;
      ASSERT_TRUE(DataLoader::create(&shared_data(), g.sequence_length, 1, g.vocab_size, true,
                                     TrainerOptions{}.data_seed, &loader)
                      .ok());
      std::vector<double> ref(static_cast<size_t>(layout.total), 0.0);
      std::vector<int32_t> in(static_cast<size_t>(g.sequence_length)), tg(in.size());
      std::vector<float> grad(ref.size());
      const float scale = static_cast<float>(1.0 / static_cast<double>(g.sequence_length * gas));
      for (int micro = 0; micro < world * gas; ++micro) {
        loader->next(in.data(), tg.data());
        ASSERT_TRUE(model->zero_grads().ok());
        MicroBatchResult res;
        ASSERT_TRUE(model->forward_backward(in.data(), tg.data(), scale, &res).ok());
        ASSERT_TRUE(be->copy_to_host(grad.data(), model->grads(), grad.size() * 4).ok());
        for (size_t i = 0; i < ref.size(); ++i) ref[i] += static_cast<double>(grad[i]) / world;
      }
      double err_out = 0.0, err_lowp = 0.0, mean_out = 0.0, max_ref = 0.0;
      for (size_t i = 0; i < ref.size(); ++i) {
        const double e = std::fabs(out[i] - ref[i]);
        err_out = std::max(err_out, e);
        mean_out += e / static_cast<double>(ref.size());
        err_lowp = std::max(err_lowp, std::fabs(one.gradients[0][i] - ref[i]));
        max_ref = std::max(max_ref, std::fabs(ref[i]));
      }
      // atol: one float ulp of the largest gradient.
      const double atol = max_ref * 0x1p-23;
      EXPECT_LE(err_out, 2 * err_lowp + atol)
          << "max error " << err_out << ", mean error " << mean_out << ", one rank's " << err_lowp;
      EXPECT_GT(max_ref, 0.0);
      // And after three steps the parameters of N ranks and of one rank agree to 1% of what
      // AdamW moves a parameter in a step (about lr = 3e-3): rounding-level differences in a
      // gradient change its update noticeably only where the gradient itself is near rounding
      // level (AdamW divides by its magnitude).
      const RankRuns z3 = train(world, config_json(world, gas, stage), 3);
      const RankRuns one3 = train(1, config_json(1, gas * world, 0), 3);
      const double diff = max_abs_diff(z3.params[0], one3.params[0], unpadded_total());
      std::printf(
          "%d ranks, stage %d, accumulation %d: gradient error %.3g (one rank %.3g, "
          "atol %.3g), parameters after 3 steps differ by %.3g\n",
          world, stage, gas, err_out, err_lowp, atol, diff);
      EXPECT_LT(diff, 1e-2 * 3e-3);
    }
  }
}

// Bucket sizes (prime, larger than the model, one element per shard boundary crossing) and the
// two communication switches change nothing in the result.
TEST_P(ZeroStages, BucketsAndSwitchesGiveTheSameBits) {
  const int world = GetParam();
  const RankRuns base = train(world, config_json(world, 1, 2, ", \"reduce_bucket_size\": 5e8"), 2);
  EXPECT_EQ(base.buckets[0], 1);  // one bucket per micro-batch: the flush at the embeddings
  int64_t previous = 1;
  for (int64_t bucket : {int64_t{4099}, int64_t{997}, int64_t{97}}) {
    const RankRuns z = train(
        world, config_json(world, 1, 2, ", \"reduce_bucket_size\": " + std::to_string(bucket)), 2);
    EXPECT_TRUE(same_prefix(z.params[0], base.params[0], z.total)) << "bucket " << bucket;
    // Full buckets are cut from the top, and the rest flushed at the end: at least
    // floor(total / bucket) buckets, at most that plus one per parameter group.
    const int64_t groups = static_cast<int64_t>(gpt_parameter_layout(zero_config()).groups.size());
    EXPECT_GE(z.buckets[0], z.total / bucket) << "bucket " << bucket;
    EXPECT_LE(z.buckets[0], z.total / bucket + groups) << "bucket " << bucket;
    EXPECT_GT(z.buckets[0], previous);
    previous = z.buckets[0];
  }
  for (const char* keys : {", \"reduce_scatter\": false", ", \"allgather_partitions\": false",
                           ", \"reduce_scatter\": false, \"reduce_bucket_size\": 333"}) {
    for (int stage : {1, 2}) {
      const RankRuns z = train(world, config_json(world, 1, stage, keys), 2);
      EXPECT_TRUE(same_prefix(z.params[0], base.params[0], unpadded_total()))
          << "stage " << stage << keys;
    }
  }
}

// Stage 2's buckets follow the backward's parameter groups also when layers are recomputed and
// the MLP and LM head run in tiles (the memory techniques change no gradient bits).
TEST_P(ZeroStages, StageTwoUnderTheMemoryTechniques) {
  const int world = GetParam();
  const RankRuns base = train(world, config_json(world, 1, 0), 2);
  const RankRuns z = train(world,
                           config_json(world, 1, 2, ", \"reduce_bucket_size\": 500",
                                       ", \"activation_checkpointing\": {}"),
                           2, [](int, TrainerOptions* o) {
                             o->memory.mlp_tile_tokens = 8;
                             o->memory.lm_head_tile_tokens = 8;
                           });
  EXPECT_GT(z.buckets[0], 10);
  EXPECT_TRUE(same_prefix(z.params[0], base.params[0], unpadded_total()));
}

// Fixed and adaptive clipping from the shards' norms equal the replicated trainer's.
TEST_P(ZeroStages, ShardedClippingEqualsUnsharded) {
  const int world = GetParam();
  for (const char* clip : {", \"gradient_clipping\": 0.05",
                           ", \"gradient_clipping\": {\"type\": \"adaptive\", \"threshold\": "
                           "0.05, \"history_window\": 3, \"adjustment_factor\": 0.5}"}) {
    SCOPED_TRACE(clip);
    const RankRuns base = train(world, config_json(world, 1, 0, "", clip), 4);
    for (int stage : {1, 2}) {
      const RankRuns z = train(world, config_json(world, 1, stage, "", clip), 4);
      for (int k = 0; k < 4; ++k) {
        const StepReport &a = z.reports[0][static_cast<size_t>(k)],
                         &b = base.reports[0][static_cast<size_t>(k)];
        EXPECT_LT(b.clip_coefficient, 1.0) << "step " << k << " did not clip";
        EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-12 * b.grad_norm);
        EXPECT_NEAR(a.clip_coefficient, b.clip_coefficient, 1e-12);
        EXPECT_NEAR(a.clip_threshold, b.clip_threshold, 1e-12 * b.clip_threshold);
        for (int r = 1; r < world; ++r) {
          EXPECT_EQ(z.reports[static_cast<size_t>(r)][static_cast<size_t>(k)].clip_coefficient,
                    a.clip_coefficient);
        }
      }
      // The coefficient enters AdamW as a float: a norm that differs in its last double bits
      // may round it to a neighbouring float, so the parameters are held to a bound far below
      // one step's movement rather than bitwise.
      const double diff = max_abs_diff(z.params[0], base.params[0], unpadded_total());
      EXPECT_LT(diff, 1e-6 * 3e-3) << "stage " << stage;
    }
  }
}

// fp16 ds_enhanced (and the standard order): an overflow on rank 1 alone makes every rank skip
// the step (the loss scale halves after it: hysteresis 1), and a clean fp16 step gives the same
// bits on every stage.
TEST_P(ZeroStages, OverflowOnOneRankSkipsEverywhere) {
  const int world = GetParam();
  for (const char* type : {"ds_enhanced", "standard"}) {
    std::vector<float> stage0;  // the clean step's parameters at stage 0
    for (int stage : {0, 1, 2}) {
      SCOPED_TRACE(std::string(type) + ", stage " + std::to_string(stage));
      const std::string fp16 = std::string(
                                   ", \"fp16\": {\"enabled\": true, \"loss_scale\": 0, "
                                   "\"initial_scale_power\": 10, \"hysteresis\": 1, "
                                   "\"type\": \"") +
                               type + "\"}";
      const RankRuns clean = train(world, config_json(world, 1, stage, "", fp16), 1);
      // The scaled path (check, unscale, reduce) gives stage 0's bits on every stage.
      if (stage == 0) stage0 = clean.params[0];
      EXPECT_TRUE(same_prefix(clean.params[0], stage0, unpadded_total()));
      const RankRuns z =
          train(world, config_json(world, 1, stage, "", fp16), 2, [](int rank, TrainerOptions* o) {
            if (rank == 1) o->inject_overflow_steps = {2};
          });
      for (int r = 0; r < world; ++r) {
        const std::vector<StepReport>& rep = z.reports[static_cast<size_t>(r)];
        EXPECT_FALSE(rep[0].skipped);
        EXPECT_TRUE(rep[1].skipped) << "rank " << r << " did not skip";
        EXPECT_EQ(rep[0].loss_scale, 1024.0);
        EXPECT_EQ(rep[1].loss_scale, 1024.0);
        EXPECT_EQ(rep[1].skipped_total, 1);
        // The skipped step changed nothing: the parameters are those after step 1.
        EXPECT_TRUE(
            same_prefix(z.params[static_cast<size_t>(r)], clean.params[0], unpadded_total()))
            << "rank " << r;
      }
      // The next step runs at half the scale on every rank, and is applied.
      const RankRuns z3 =
          train(world, config_json(world, 1, stage, "", fp16), 3, [](int rank, TrainerOptions* o) {
            if (rank == 1) o->inject_overflow_steps = {2};
          });
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(z3.reports[static_cast<size_t>(r)][2].loss_scale, 512.0) << "rank " << r;
        EXPECT_FALSE(z3.reports[static_cast<size_t>(r)][2].skipped) << "rank " << r;
      }
      // The parameters did move in step 1 (the comparison above is not between two inits).
      std::vector<float> init(static_cast<size_t>(unpadded_total()));
      init_gpt_parameters(zero_config(), gpt_parameter_layout(zero_config()), init.data());
      EXPECT_FALSE(same_prefix(clean.params[0], init, unpadded_total()));
    }
  }
}

// What each rank holds: 1/N of m and v (and, stage 2, of the reduced gradients) in the ledger.
TEST_P(ZeroStages, LedgerShowsTheShards) {
  const int world = GetParam();
  for (int stage : {1, 2}) {
    const RankRuns z = train(world, config_json(world, 1, stage), 1);
    uint64_t shard_bytes = 0;
    for (const auto& e : z.ledgers[0].entries()) {
      if (e.name.find("ZeRO") != std::string::npos) shard_bytes += e.bytes;
    }
    const uint64_t per_state = static_cast<uint64_t>(z.total / world) * 4;
    EXPECT_EQ(shard_bytes, per_state * (stage == 2 ? 3 : 2));
  }
}

// One process per rank (the TCP test communicator, forked processes on 127.0.0.1) trains as the
// thread ranks do, bit for bit: the same collectives in the same order, the same rank-order sums.
// The processes are forked before this test process runs anything in parallel (process_ranks.h).
TEST_P(ZeroStages, ProcessesEqualThreadRanksBitwise) {
  const int world = GetParam();
  const int steps = 2;
  for (int stage : {0, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const std::string json = config_json(world, 2, stage, ", \"reduce_bucket_size\": 300");
    const std::vector<RankResult> procs = run_process_ranks(world, [&](const ProcessEnv& env) {
      std::unique_ptr<Communicator> comm;
      RendezvousOptions ro;
      ro.timeout_seconds = 60;
      Status s = make_tcp_communicator(env, ro, &comm);
      std::unique_ptr<Trainer> t;
      if (s.ok()) s = make_trainer(parse(json, world), comm.get(), TrainerOptions{}, &t);
      std::string losses;
      for (int k = 0; k < steps && s.ok(); ++k) {
        StepReport rep;
        s = t->step(&rep);
        losses.append(reinterpret_cast<const char*>(&rep.loss), sizeof rep.loss);
      }
      std::vector<float> params;
      if (s.ok()) s = t->master_parameters(&params);
      return RankResult{s, losses + std::string(reinterpret_cast<const char*>(params.data()),
                                                params.size() * sizeof(float))};
    });
    const RankRuns threads = train(world, json, steps);
    std::string want;
    for (const StepReport& rep : threads.reports[0]) {
      want.append(reinterpret_cast<const char*>(&rep.loss), sizeof rep.loss);
    }
    want.append(reinterpret_cast<const char*>(threads.params[0].data()),
                threads.params[0].size() * sizeof(float));
    expect_real_training(threads, world);
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(procs[r].status.ok()) << "rank " << r << ": " << procs[r].status.to_string();
      EXPECT_TRUE(procs[r].bytes == want) << "rank " << r << " differs from the thread ranks";
    }
  }
}

// The tiny GPT with more layers: buckets smaller than a layer need two layer gradient buffers at
// stage 2, fewer than the layers.
GptConfig layered_config(int64_t layers) {
  GptConfig g = zero_config();
  g.n_layers = layers;
  return g;
}

// The plan of one of `world` ranks training `model` with the DeepSpeed config `json` on the CPU
// (the tests' micro-batch and token chunk).
PlanInput plan_input(const GptConfig& model, int world, const std::string& json) {
  PlanInput in;
  in.model = model;
  in.micro_batch = 1;
  in.compute_dtype = DType::kF32;
  in.token_chunk = 8;
  in.device = Device::kCpu;
  in.world_size = world;
  in.zero = parse(json, world).zero;
  return in;
}

// fp16 with dynamic loss scaling from 2^10, ds_enhanced (config_json's `extra`).
constexpr char kDsEnhancedFp16[] =
    ", \"fp16\": {\"enabled\": true, \"loss_scale\": 0, \"initial_scale_power\": 10, "
    "\"hysteresis\": 1, \"type\": \"ds_enhanced\"}";

// The gradient bytes of a ledger: its "model states" entries that hold gradients (the whole
// buffer, or the group buffers and the ZeRO-2 shard).
uint64_t gradient_bytes(const MemoryLedger& ledger) {
  uint64_t bytes = 0;
  for (const auto& e : ledger.entries()) {
    if (e.category == "model states" && e.name.find("gradients") != std::string::npos) {
      bytes += e.bytes;
    }
  }
  return bytes;
}

// Stage 2's group gradient buffers, reused once their buckets are reduced, give the bits of the
// whole gradient buffer (the layout stage 2 had before them, kept by
// zero2_whole_gradient_buffer): three micro-batches per rank, buckets smaller than a layer (so
// buckets span groups and layer buffers are reused within each micro-batch) and larger, fp32 and
// fp16 ds_enhanced with an overflow on one rank; and they stay within the accumulation bound of
// stage 1.
TEST_P(ZeroStages, ReusedGradientBuffersGiveTheWholeBufferBits) {
  const int world = GetParam();
  const GptConfig model = layered_config(4);
  const ParameterLayout layout = gpt_parameter_layout(model, zero_parameter_multiple(world));
  const int gas = 3, steps = 3;
  const std::string fp16 = kDsEnhancedFp16;
  auto whole = [](int, TrainerOptions* o) { o->zero2_whole_gradient_buffer = true; };
  auto overflow = [](bool whole_buffer) {
    return [whole_buffer](int rank, TrainerOptions* o) {
      o->zero2_whole_gradient_buffer = whole_buffer;
      if (rank == 1) o->inject_overflow_steps = {2};
    };
  };
  for (int64_t bucket : {int64_t{97}, int64_t{5000}}) {
    SCOPED_TRACE("reduce_bucket_size " + std::to_string(bucket));
    EXPECT_LT(zero_layer_gradient_buffers(layout, bucket), model.n_layers);
    const std::string keys = ", \"reduce_bucket_size\": " + std::to_string(bucket);
    for (const bool half : {false, true}) {
      SCOPED_TRACE(half ? "fp16 ds_enhanced, overflow on rank 1 in step 2" : "fp32");
      const std::string json = config_json(world, gas, 2, keys, half ? fp16 : "");
      const RankRuns reference = half ? train(world, json, steps, overflow(true), model)
                                      : train(world, json, steps, whole, model);
      const RankRuns reused = half ? train(world, json, steps, overflow(false), model)
                                   : train(world, json, steps, {}, model);
      ASSERT_EQ(reused.total, layout.total);
      for (int r = 0; r < world; ++r) {
        const size_t i = static_cast<size_t>(r);
        EXPECT_TRUE(same_prefix(reused.params[i], reference.params[i], layout.total))
            << "rank " << r << ": max |diff| "
            << max_abs_diff(reused.params[i], reference.params[i], layout.total);
        EXPECT_TRUE(reused.gradients[i] == reference.gradients[i]) << "rank " << r;
        EXPECT_TRUE(reused.exp_avg[i] == reference.exp_avg[i]) << "rank " << r;
        EXPECT_EQ(reused.buckets[i], reference.buckets[i]) << "rank " << r;
        // Every micro-batch cut at least total / bucket full buckets.
        EXPECT_GE(reused.buckets[i], gas * (layout.total / bucket)) << "rank " << r;
        for (int k = 0; k < steps; ++k) {
          const StepReport &a = reused.reports[i][static_cast<size_t>(k)],
                           &b = reference.reports[i][static_cast<size_t>(k)];
          EXPECT_EQ(a.loss, b.loss) << "step " << k;
          EXPECT_EQ(a.skipped, b.skipped) << "step " << k;
          EXPECT_EQ(a.skipped, half && k == 1) << "step " << k;
          if (!a.skipped) {
            EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << k;
          }
        }
      }
      // Which buffers the two held.
      EXPECT_LT(gradient_bytes(reused.ledgers[0]), gradient_bytes(reference.ledgers[0]));
    }
  }
  // Against stage 1 (which adds the micro-batches before reducing): AccumulationOnEachRank's
  // bound, 1% of AdamW's per-step movement.
  const RankRuns z1 = train(world, config_json(world, gas, 1), steps, {}, model);
  const RankRuns z2 =
      train(world, config_json(world, gas, 2, ", \"reduce_bucket_size\": 97"), steps, {}, model);
  std::vector<float> init(static_cast<size_t>(layout.total));
  init_gpt_parameters(model, layout, init.data());
  EXPECT_FALSE(same_prefix(z2.params[0], init, layout.total));
  const double diff = max_abs_diff(z2.params[0], z1.params[0], layout.total);
  std::printf(
      "ZeRO-2 (reused gradient buffers) vs ZeRO-1, %d micro-batches, %d ranks: "
      "max |diff| %.3g\n",
      gas, world, diff);
  EXPECT_LT(diff, 1e-2 * 3e-3);
}

// overlap_comm starts stage 2's bucket reductions and finishes them later (before their buffer
// is reused, at the end of each backward): the same collectives in the same order, so the same
// bits as calling them. Stages 0, 1 and 2, three micro-batches per rank, buckets from 13
// elements (hundreds of pieces in flight at once) to one per micro-batch, with and without
// reduce_scatter, fp32 and fp16 ds_enhanced with an overflow on one rank and clipping:
// parameters, shards, m, losses, norms and bucket counts equal overlap_comm false's bit for bit.
// The overlap costs one layer buffer more when the buckets leave layers to reuse, in the ledger
// and in the plan alike.
TEST_P(ZeroStages, OverlapCommGivesTheCalledBits) {
  const int world = GetParam();
  const GptConfig model = layered_config(4);
  const ParameterLayout layout = gpt_parameter_layout(model, zero_parameter_multiple(world));
  const int gas = 3, steps = 3;
  const std::string fp16 = std::string(kDsEnhancedFp16) + ", \"gradient_clipping\": 0.05";
  auto overflow = [](int rank, TrainerOptions* o) {
    if (rank == 1) o->inject_overflow_steps = {2};
  };
  struct Case {
    int stage;
    int64_t bucket;
    bool half;
    std::string keys;
  };
  const std::vector<Case> cases = {
      {0, 97, false, ""},        {0, 97, true, ""},
      {1, 97, false, ""},        {1, 97, true, ""},
      {2, 13, false, ""},        {2, 13, true, ""},
      {2, 97, false, ""},        {2, 5000, true, ""},
      {2, 500000000, false, ""}, {2, 97, false, ", \"reduce_scatter\": false"}};
  const int64_t S = layout.groups[1].end - layout.groups[1].begin;
  for (const Case& c : cases) {
    const std::string what = "stage " + std::to_string(c.stage) + ", reduce_bucket_size " +
                             std::to_string(c.bucket) + (c.half ? ", fp16 ds_enhanced" : "") +
                             c.keys;
    SCOPED_TRACE(what);
    const std::string keys = ", \"reduce_bucket_size\": " + std::to_string(c.bucket) + c.keys;
    const std::string extra = c.half ? fp16 : "";
    const OptionsFn options = c.half ? OptionsFn(overflow) : OptionsFn();
    const std::string json_off =
        config_json(world, gas, c.stage, keys + ", \"overlap_comm\": false", extra);
    const std::string json_on =
        config_json(world, gas, c.stage, keys + ", \"overlap_comm\": true", extra);
    const RankRuns off = train(world, json_off, steps, options, model);
    const RankRuns on = train(world, json_on, steps, options, model);
    ASSERT_EQ(on.total, off.total);
    ASSERT_EQ(on.total, c.stage > 0 ? layout.total : gpt_parameter_layout(model).total);
    for (int r = 0; r < world; ++r) {
      const size_t i = static_cast<size_t>(r);
      EXPECT_TRUE(same_prefix(on.params[i], off.params[i], on.total))
          << "rank " << r << ": max |diff| " << max_abs_diff(on.params[i], off.params[i], on.total);
      EXPECT_TRUE(on.gradients[i] == off.gradients[i]) << "rank " << r;
      EXPECT_TRUE(on.exp_avg[i] == off.exp_avg[i]) << "rank " << r;
      EXPECT_EQ(on.buckets[i], off.buckets[i]) << "rank " << r;
      EXPECT_EQ(off.in_flight[i], 0) << "rank " << r;
      if (c.stage == 2 && c.bucket == 13) {
        // Tiny buckets: many pieces in flight at once (a layer's worth before its buffer is
        // needed again).
        EXPECT_GT(on.in_flight[i], S / 13) << "rank " << r;
      } else if (c.stage != 2) {
        EXPECT_EQ(on.in_flight[i], 0) << "rank " << r;
      }
      for (int k = 0; k < steps; ++k) {
        const StepReport &a = on.reports[i][static_cast<size_t>(k)],
                         &b = off.reports[i][static_cast<size_t>(k)];
        EXPECT_EQ(a.loss, b.loss) << "step " << k;
        EXPECT_EQ(a.skipped, b.skipped) << "step " << k;
        EXPECT_EQ(a.skipped, c.half && k == 1) << "step " << k;
        if (!a.skipped) {
          EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << k;
          EXPECT_EQ(a.clip_coefficient, b.clip_coefficient) << "step " << k;
        }
      }
      if (c.half) {
        // The clipping threshold was met in some step, so the coefficient was exercised.
        EXPECT_TRUE(std::any_of(on.reports[i].begin(), on.reports[i].end(),
                                [](const StepReport& s) { return s.clip_coefficient < 1.0; }))
            << "rank " << r;
      }
    }
    if (c.stage == 2) {
      // The memory: one layer buffer more with overlap, unless every layer has one already.
      const int64_t k_off = zero_layer_gradient_buffers(layout, c.bucket);
      const int64_t k_on = zero_layer_gradient_buffers(layout, c.bucket, true);
      EXPECT_EQ(k_on, std::min<int64_t>(k_off + 1, model.n_layers));
      EXPECT_EQ(gradient_bytes(on.ledgers[0]),
                gradient_bytes(off.ledgers[0]) + 4 * static_cast<uint64_t>((k_on - k_off) * S));
      MemoryPlan plan;
      ASSERT_TRUE(plan_training_memory(plan_input(model, world, json_on), &plan).ok());
      EXPECT_EQ(gradient_bytes(plan.ledger), gradient_bytes(on.ledgers[0]));
    }
  }
}

// The gradient memory of a stage-2 rank in its ledger is the arithmetic's: the embeddings' group
// E, the head group H, k = zero_layer_gradient_buffers layer buffers of S elements and the
// reduced shard total / N, 4 bytes each, where stage 1 holds the whole buffer (4 total bytes);
// plan_gpt_memory gives the model's share of it (everything but the ZeRO shards) as well. Eight
// layers, so that two layer buffers and a shard are less than the whole at 2 ranks too.
TEST_P(ZeroStages, StageTwoLedgerHoldsGroupBuffersNotTheWholeGradient) {
  const int world = GetParam();
  const GptConfig model = layered_config(8);
  const MemoryOptions defaults;
  const ParameterLayout layout = gpt_parameter_layout(model, zero_parameter_multiple(world));
  const std::vector<ParameterGroup>& g = layout.groups;
  const int64_t n = model.n_layers;
  const int64_t E = g[0].end - g[0].begin,
                H = g[static_cast<size_t>(n + 1)].end - g[static_cast<size_t>(n + 1)].begin;
  const int64_t S = g[1].end - g[1].begin;
  // Buckets of 97 elements leave fewer than 97 unreduced when a layer starts: two buffers.
  ASSERT_EQ(zero_layer_gradient_buffers(layout, 97), 2);
  ASSERT_EQ(zero_layer_gradient_buffers(layout, S + 1), 2);
  ASSERT_EQ(zero_layer_gradient_buffers(layout, S + 2), 3);
  ASSERT_EQ(zero_layer_gradient_buffers(layout, 500000000), n);
  const uint64_t stage2 = 4 * static_cast<uint64_t>(E + H + 2 * S + layout.total / world);
  const uint64_t stage1 = 4 * static_cast<uint64_t>(layout.total);
  std::printf("%d ranks, %lld elements: gradient bytes per rank, stage 1 %llu, stage 2 %llu\n",
              world, static_cast<long long>(layout.total), static_cast<unsigned long long>(stage1),
              static_cast<unsigned long long>(stage2));
  EXPECT_LT(stage2, stage1);
  const RankRuns z2 =
      train(world, config_json(world, 2, 2, ", \"reduce_bucket_size\": 97"), 1, {}, model);
  const RankRuns z1 = train(world, config_json(world, 2, 1), 1, {}, model);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(gradient_bytes(z2.ledgers[static_cast<size_t>(r)]), stage2) << "rank " << r;
    EXPECT_EQ(gradient_bytes(z1.ledgers[static_cast<size_t>(r)]), stage1) << "rank " << r;
  }
  // The plan of the model's buffers is the ledger's, ZeRO's shards aside.
  MemoryOptions memory = defaults;
  memory.parameter_multiple = zero_parameter_multiple(world);
  memory.layer_gradient_buffers = 2;
  MemoryLedger plan;
  ASSERT_TRUE(plan_gpt_memory(model, nullptr, 1, memory, DType::kF32, 8, Device::kCpu, &plan).ok());
  uint64_t shards = 0;
  for (const auto& e : z2.ledgers[0].entries()) {
    if (e.name.find("ZeRO") != std::string::npos) shards += e.bytes;
  }
  EXPECT_EQ(plan.total(Device::kCpu), z2.ledgers[0].total(Device::kCpu) - shards);
  EXPECT_EQ(gradient_bytes(plan), stage2 - 4 * static_cast<uint64_t>(layout.total / world));
}

// plan_training_memory for N ranks (PlanInput::world_size and zero) plans what a rank's trainer
// allocates: at stages 0, 1 and 2, its entries other than the back end's estimates add up to
// the rank's ledger, gradients included.
TEST_P(ZeroStages, PlanIsTheRanksLedger) {
  const int world = GetParam();
  const GptConfig model = layered_config(8);
  for (int stage : {0, 1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    const std::string json = config_json(world, 2, stage, ", \"reduce_bucket_size\": 97");
    const RankRuns z = train(world, json, 1, {}, model);
    MemoryPlan plan;
    ASSERT_TRUE(plan_training_memory(plan_input(model, world, json), &plan).ok());
    uint64_t planned = 0;
    for (const auto& e : plan.ledger.entries()) {
      if (e.category != "back end") planned += e.bytes;
    }
    EXPECT_EQ(planned, z.ledgers[0].total(Device::kCpu));
    EXPECT_EQ(gradient_bytes(plan.ledger), gradient_bytes(z.ledgers[0]));
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, ZeroStages, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::to_string(i.param) + "ranks";
                         });

TEST(ZeroRefusals, MismatchesAndUnbuiltPathsAreNamed) {
  // A config resolved for 2 ranks on 4.
  const TrainConfig two = parse(config_json(2, 1, 1), 2);
  std::vector<Status> st = run_thread_ranks(4, [&](Communicator& comm) {
    std::unique_ptr<Trainer> t;
    return make_trainer(two, &comm, {}, &t);
  });
  for (const Status& s : st) {
    EXPECT_NE(s.message().find("resolved for 2 data-parallel rank(s)"), std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find("the communicator has 4"), std::string::npos);
  }
  // The optimizer offload with several ranks is not built yet.
  const TrainConfig off =
      parse(config_json(2, 1, 2, ", \"offload_optimizer\": {\"device\": \"cpu\"}"), 2);
  st = run_thread_ranks(2, [&](Communicator& comm) {
    std::unique_ptr<Trainer> t;
    return make_trainer(off, &comm, {}, &t);
  });
  for (const Status& s : st) {
    EXPECT_EQ(s.code(), StatusCode::kNotSupported);
    EXPECT_NE(s.message().find("zero_optimization.offload_optimizer"), std::string::npos);
  }
  const TrainConfig c = parse(config_json(2, 1, 1), 2);
  // A rank that fails while creating its trainer does not hang the others.
  st = run_thread_ranks(2, [&](Communicator& comm) -> Status {
    if (comm.rank() == 1) return Status::invalid_argument("no data on rank 1");
    std::unique_ptr<Trainer> t;
    Status s = make_trainer(c, &comm, {}, &t);
    if (!s.ok()) return s;
    StepReport r;
    return t->step(&r);
  });
  EXPECT_NE(st[0].message().find("rank 1 failed: no data on rank 1"), std::string::npos)
      << st[0].message();
}

TEST(ZeroRefusals, OptimizerNeedsAPaddedLayout) {
  std::unique_ptr<Backend> be = cpu_backend(8, 1);
  const GptConfig g = zero_config();
  std::unique_ptr<GptModel> model;
  MemoryOptions memory;
  memory.parameter_multiple = 3;  // a total that is a multiple of 3 but not of 4 * 16
  ASSERT_TRUE(GptModel::create(g, nullptr, 1, memory, be.get(), &model).ok());
  ASSERT_NE(model->layout().total % 64, 0);
  std::vector<float> init(static_cast<size_t>(model->layout().total));
  const std::vector<Status> st = run_thread_ranks(4, [&](Communicator& comm) {
    ZeroConfig zc;
    zc.stage = 1;
    std::unique_ptr<ZeroOptimizer> z;
    return ZeroOptimizer::create(zc, &comm, model.get(), init.data(), &z);
  });
  for (const Status& s : st) {
    EXPECT_NE(s.message().find("is not a multiple of 64"), std::string::npos) << s.message();
  }
  ZeroConfig zc;
  zc.stage = 3;
  SingleRankCommunicator one;
  std::unique_ptr<ZeroOptimizer> z;
  EXPECT_NE(ZeroOptimizer::create(zc, &one, model.get(), init.data(), &z)
                .message()
                .find("zero_optimization.stage must be 1 or 2; got 3"),
            std::string::npos);
  memory.parameter_multiple = 0;
  EXPECT_NE(GptModel::create(g, nullptr, 1, memory, be.get(), &model)
                .message()
                .find("parameter_multiple must be >= 1"),
            std::string::npos);
}

// A model whose layers share fewer gradient buffers than the buckets need, or that has no whole
// buffer for stage 1, is refused by name; a negative count is refused by the model.
TEST(ZeroRefusals, GradientBuffersMustCoverTheBuckets) {
  std::unique_ptr<Backend> be = cpu_backend(8, 1);
  const GptConfig g = zero_config();  // two layers
  MemoryOptions memory;
  memory.parameter_multiple = zero_parameter_multiple(2);
  memory.layer_gradient_buffers = 1;
  std::unique_ptr<GptModel> model;
  ASSERT_TRUE(GptModel::create(g, nullptr, 1, memory, be.get(), &model).ok());
  EXPECT_EQ(model->grads(), nullptr);
  std::vector<float> init(static_cast<size_t>(model->layout().total));
  auto create = [&](int stage, int64_t bucket) {
    std::vector<Status> st = run_thread_ranks(2, [&](Communicator& comm) {
      ZeroConfig zc;
      zc.stage = stage;
      zc.reduce_bucket_size = bucket;
      std::unique_ptr<ZeroOptimizer> z;
      return ZeroOptimizer::create(zc, &comm, model.get(), init.data(), &z);
    });
    return st[0];
  };
  const Status big = create(2, 500000000);
  EXPECT_NE(big.message().find("reduce_bucket_size 500000000 needs at least 2"), std::string::npos)
      << big.message();
  const Status one = create(1, 500000000);
  EXPECT_NE(one.message().find("zero_optimization.stage 1"), std::string::npos) << one.message();
  EXPECT_NE(one.message().find("one whole gradient buffer"), std::string::npos) << one.message();
  // Buckets of one element leave nothing unreduced when a layer starts: one buffer is enough.
  EXPECT_TRUE(create(2, 1).ok());
  memory.layer_gradient_buffers = -1;
  EXPECT_NE(GptModel::create(g, nullptr, 1, memory, be.get(), &model)
                .message()
                .find("layer_gradient_buffers must be >= 0"),
            std::string::npos);
}

// The data-parallel loader: skipping k micro-batches leaves the position where k next() calls
// would, across an epoch's end.
TEST(ZeroData, SkipWalksLikeNext) {
  std::unique_ptr<DataLoader> a, b;
  const GptConfig g = zero_config();
  ASSERT_TRUE(
      DataLoader::create(&shared_data(), g.sequence_length, 3, g.vocab_size, true, 9, &a).ok());
  ASSERT_TRUE(
      DataLoader::create(&shared_data(), g.sequence_length, 3, g.vocab_size, true, 9, &b).ok());
  std::vector<int32_t> ia(36), ta(36), ib(36), tb(36);
  for (int64_t k : {0, 1, 2, 5, 11}) {
    for (int64_t i = 0; i < k; ++i) a->next(ia.data(), ta.data());
    b->skip(k);
    EXPECT_EQ(a->position().epoch, b->position().epoch) << k;
    EXPECT_EQ(a->position().cursor, b->position().cursor) << k;
    a->next(ia.data(), ta.data());
    b->next(ib.data(), tb.data());
    EXPECT_EQ(ia, ib) << k;
  }
  EXPECT_GT(a->position().epoch, 0u);  // the walk crossed an epoch
}

// ---------------------------------------------------------------------------------------------
// Checkpoints with several ranks: a folder with a manifest, the replicated state and one shard
// file per rank, loadable on any number of ranks.

// fp16 with dynamic loss scaling, so that an injected overflow leaves loss-scaler state (a halved
// scale, a skipped step) that a resumed run must carry on from.
const char kFp16[] =
    ", \"fp16\": {\"enabled\": true, \"loss_scale\": 0, \"initial_scale_power\": 10, "
    "\"hysteresis\": 1}";

// One segment of a run: resume from `load` (or start fresh), save at once to `save_after_load`,
// train `steps` steps (the last rank gets an overflow at global step `inject_step`, 0: none),
// then save to `save`.
struct Segment {
  std::string load, save_after_load, save;
  int steps = 0;
  int64_t inject_step = 0;
};

struct SegmentRun {
  std::vector<float> loaded;        // the gathered master weights after the load (rank 0)
  std::vector<float> params;        // ... after the steps
  std::vector<StepReport> reports;  // rank 0's
  int64_t step_after_load = -1;
  int64_t total = 0;  // the layout's (padded) total on these ranks
};

// `global_batch` micro-batches per step, split over `world` ranks.
SegmentRun run_segment(int world, int stage, int global_batch, const Segment& seg) {
  const TrainConfig c = parse(config_json(world, global_batch / world, stage, "", kFp16), world);
  SegmentRun out;
  const std::vector<Status> st = run_thread_ranks(world, [&](Communicator& comm) -> Status {
    TrainerOptions o;
    if (seg.inject_step > 0 && comm.rank() == world - 1)
      o.inject_overflow_steps = {seg.inject_step};
    std::unique_ptr<Trainer> t;
    Status s = make_trainer(c, &comm, o, &t);
    if (!s.ok()) return s;
    if (!seg.load.empty() && !(s = t->load_checkpoint(seg.load)).ok()) return s;
    std::vector<float> p;
    if (!(s = t->master_parameters(&p)).ok()) return s;
    if (comm.rank() == 0) {
      out.loaded = p;
      out.step_after_load = t->global_step();
      out.total = t->model().layout().total;
    }
    if (!seg.save_after_load.empty() && !(s = t->save_checkpoint(seg.save_after_load)).ok()) {
      return s;
    }
    for (int k = 0; k < seg.steps; ++k) {
      StepReport rep;
      if (!(s = t->step(&rep)).ok()) return s;
      if (comm.rank() == 0) out.reports.push_back(rep);
    }
    if (!(s = t->master_parameters(&p)).ok()) return s;
    if (comm.rank() == 0) out.params = p;
    if (!seg.save.empty()) return t->save_checkpoint(seg.save);
    return Status::ok_status();
  });
  for (size_t r = 0; r < st.size(); ++r)
    EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].to_string();
  return out;
}

// The unpadded flat master weights, m and v a checkpoint holds, put together by the test from the
// shard files of a folder written on `world` ranks, or from the slots of a single-rank file
// (world 1), without the trainer's loader.
struct SavedState {
  std::vector<float> master, exp_avg, exp_avg_sq;
};

SavedState read_saved_state(const std::string& path, int world) {
  SavedState out;
  const int64_t n = unpadded_total();
  std::string header;
  std::vector<CheckpointTensor> tensors;
  if (world == 1) {
    EXPECT_TRUE(read_checkpoint(path, &header, &tensors).ok()) << path;
    const ParameterLayout layout = gpt_parameter_layout(zero_config());
    for (std::vector<float>* v : {&out.master, &out.exp_avg, &out.exp_avg_sq})
      v->assign(static_cast<size_t>(n), 0.0f);
    for (const CheckpointTensor& t : tensors) {
      const size_t slash = t.name.find('/');
      const std::string kind = t.name.substr(0, slash);
      std::vector<float>* dst = kind == "params"    ? &out.master
                                : kind == "exp_avg" ? &out.exp_avg
                                                    : &out.exp_avg_sq;
      const TensorSlot* slot = layout.find(t.name.substr(slash + 1));
      EXPECT_NE(slot, nullptr) << t.name;
      if (slot != nullptr) std::memcpy(dst->data() + slot->offset, t.bytes.data(), t.bytes.size());
    }
    return out;
  }
  for (int r = 0; r < world; ++r) {
    char name[64];
    std::snprintf(name, sizeof name, "/shard-%05d-of-%05d.ckpt", r, world);
    EXPECT_TRUE(read_checkpoint(path + name, &header, &tensors).ok()) << path << name;
    EXPECT_EQ(tensors.size(), 3u);
    for (const CheckpointTensor& t : tensors) {
      std::vector<float>* dst = t.name == "master"    ? &out.master
                                : t.name == "exp_avg" ? &out.exp_avg
                                                      : &out.exp_avg_sq;
      const float* f = reinterpret_cast<const float*>(t.bytes.data());
      dst->insert(dst->end(), f, f + t.bytes.size() / sizeof(float));
    }
  }
  for (std::vector<float>* v : {&out.master, &out.exp_avg, &out.exp_avg_sq}) {
    // The padding the shards carry past the parameters is zero.
    EXPECT_GE(static_cast<int64_t>(v->size()), n);
    for (size_t i = static_cast<size_t>(n); i < v->size(); ++i) EXPECT_EQ((*v)[i], 0.0f);
    v->resize(static_cast<size_t>(std::min<int64_t>(n, static_cast<int64_t>(v->size()))));
  }
  return out;
}

bool nonzero(const std::vector<float>& v) {
  return std::any_of(v.begin(), v.end(), [](float x) { return x != 0.0f; });
}

std::string ckpt_dir(const std::string& name) {
  return sciattn::testing::process_temp_dir() + name;
}

class ZeroCheckpointSameRanks : public ::testing::TestWithParam<std::tuple<int, int>> {};

// Save after 3 steps on N ranks (an overflow skipped at step 2 on the last rank), resume on N
// ranks for 2 more: the parameters, the losses and the loss scale are those of 5 straight steps,
// bit for bit. Two micro-batches per rank, so the data position moves by 2N per step and wraps
// an epoch with 4 ranks.
TEST_P(ZeroCheckpointSameRanks, ResumeIsBitwise) {
  const auto [stage, world] = GetParam();
  const int batch = 2 * world;
  const std::string dir = ckpt_dir("same_" + std::to_string(stage) + "_" + std::to_string(world));
  Segment whole;
  whole.steps = 5;
  whole.inject_step = 2;
  const SegmentRun full = run_segment(world, stage, batch, whole);
  Segment first = whole;
  first.steps = 3;
  first.save = dir;
  const SegmentRun a = run_segment(world, stage, batch, first);
  Segment second;
  second.load = dir;
  second.steps = 2;
  const SegmentRun b = run_segment(world, stage, batch, second);

  // The folder: a manifest, the replicated state, one shard per rank with nonzero m and v.
  EXPECT_TRUE(std::filesystem::exists(dir + "/manifest.json"));
  EXPECT_TRUE(std::filesystem::exists(dir + "/replicated.ckpt"));
  const SavedState saved = read_saved_state(dir, world);
  EXPECT_TRUE(nonzero(saved.exp_avg) && nonzero(saved.exp_avg_sq));
  EXPECT_TRUE(same_prefix(saved.master, a.params, unpadded_total()));

  // The run really trained, overflowed and moved the scale before the save.
  ASSERT_EQ(full.reports.size(), 5u);
  EXPECT_TRUE(full.reports[1].skipped);
  EXPECT_EQ(full.reports[3].loss_scale, 512.0);
  std::vector<float> init(static_cast<size_t>(unpadded_total()));
  init_gpt_parameters(zero_config(), gpt_parameter_layout(zero_config()), init.data());
  EXPECT_FALSE(same_prefix(a.params, init, unpadded_total()));

  // The resumed run.
  EXPECT_EQ(b.step_after_load, 3);
  ASSERT_EQ(b.loaded.size(), a.params.size());
  EXPECT_TRUE(bitwise_equal(b.loaded.data(), a.params.data(), a.params.size()));
  ASSERT_EQ(b.params.size(), full.params.size());
  EXPECT_TRUE(bitwise_equal(b.params.data(), full.params.data(), full.params.size()))
      << "max |diff| " << max_abs_diff(b.params, full.params, unpadded_total());
  ASSERT_EQ(b.reports.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    const StepReport &x = b.reports[k], &y = full.reports[k + 3];
    EXPECT_EQ(x.step, y.step);
    EXPECT_EQ(x.loss, y.loss) << "step " << y.step;
    EXPECT_EQ(x.grad_norm, y.grad_norm) << "step " << y.step;
    EXPECT_EQ(x.loss_scale, y.loss_scale) << "step " << y.step;
    EXPECT_EQ(x.lr, y.lr);
    EXPECT_EQ(x.skipped_total, y.skipped_total);
  }
}

INSTANTIATE_TEST_SUITE_P(StagesAndRanks, ZeroCheckpointSameRanks,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Values(2, 4)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& i) {
                           return "stage" + std::to_string(std::get<0>(i.param)) + "_" +
                                  std::to_string(std::get<1>(i.param)) + "ranks";
                         });

struct Reshard {
  int from, from_stage, to, to_stage;
  bool bitwise;  // whether the steps after the resume equal the straight run bit for bit
};

void PrintTo(const Reshard& p, std::ostream* os) {
  *os << p.from << " ranks (stage " << p.from_stage << ") -> " << p.to << " ranks (stage "
      << p.to_stage << ")";
}

class ZeroCheckpointOtherRanks : public ::testing::TestWithParam<Reshard> {};

// Save on N ranks after 3 steps (global batch 4 micro-batches, an overflow at step 2), load on N'
// ranks (and other stages), save again at once: the second checkpoint holds the first one's
// master weights, m and v bit for bit, and the gathered weights after the load are the saved
// ones. Then 2 more steps against 5 straight steps on N ranks: with another rank count the
// gradients of a step are summed in another association (each rank accumulates its micro-batches
// inside the layers before the mean over ranks), so the parameters are held to 1% of AdamW's
// per-step movement (lr) and the first step's loss, on equal parameters, to 1e-12 relative; on
// the same ranks stage 0 and stage 1 reduce alike and continue bit for bit.
TEST_P(ZeroCheckpointOtherRanks, StateIsExactAndTrainingContinues) {
  const Reshard p = GetParam();
  const std::string tag = std::to_string(p.from) + "_" + std::to_string(p.from_stage) + "_to_" +
                          std::to_string(p.to) + "_" + std::to_string(p.to_stage);
  const std::string saved_path = ckpt_dir("from_" + tag), again_path = ckpt_dir("again_" + tag);
  Segment whole;
  whole.steps = 5;
  whole.inject_step = 2;
  const SegmentRun full = run_segment(p.from, p.from_stage, 4, whole);
  Segment first = whole;
  first.steps = 3;
  first.save = saved_path;
  const SegmentRun a = run_segment(p.from, p.from_stage, 4, first);
  Segment second;
  second.load = saved_path;
  second.save_after_load = again_path;
  second.steps = 2;
  const SegmentRun b = run_segment(p.to, p.to_stage, 4, second);

  const int64_t n = unpadded_total();
  const SavedState x = read_saved_state(saved_path, p.from), y = read_saved_state(again_path, p.to);
  ASSERT_EQ(static_cast<int64_t>(x.master.size()), n);
  ASSERT_EQ(static_cast<int64_t>(y.master.size()), n);
  EXPECT_TRUE(nonzero(x.exp_avg) && nonzero(x.exp_avg_sq));
  EXPECT_TRUE(same_prefix(x.master, y.master, n));
  EXPECT_TRUE(same_prefix(x.exp_avg, y.exp_avg, n));
  EXPECT_TRUE(same_prefix(x.exp_avg_sq, y.exp_avg_sq, n));
  EXPECT_TRUE(same_prefix(x.master, a.params, n));
  // The weights every rank holds after the load, and the new layout's padding zero.
  EXPECT_EQ(b.step_after_load, 3);
  EXPECT_TRUE(same_prefix(b.loaded, a.params, n));
  for (int64_t i = n; i < b.total; ++i) EXPECT_EQ(b.loaded[static_cast<size_t>(i)], 0.0f);
  std::vector<float> init(static_cast<size_t>(n));
  init_gpt_parameters(zero_config(), gpt_parameter_layout(zero_config()), init.data());
  EXPECT_FALSE(same_prefix(b.loaded, init, n));

  ASSERT_EQ(b.reports.size(), 2u);
  const double diff = max_abs_diff(b.params, full.params, n);
  std::printf(
      "%d ranks (stage %d) -> %d ranks (stage %d): after 2 more steps max |diff| %.3g, "
      "losses %.17g %.17g vs %.17g %.17g\n",
      p.from, p.from_stage, p.to, p.to_stage, diff, b.reports[0].loss, b.reports[1].loss,
      full.reports[3].loss, full.reports[4].loss);
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(b.reports[k].step, full.reports[k + 3].step);
    EXPECT_EQ(b.reports[k].loss_scale, full.reports[k + 3].loss_scale);
    EXPECT_FALSE(b.reports[k].skipped);
  }
  if (p.bitwise) {
    EXPECT_EQ(diff, 0.0);
    EXPECT_EQ(b.reports[0].loss, full.reports[3].loss);
    EXPECT_EQ(b.reports[1].loss, full.reports[4].loss);
  } else {
    EXPECT_NEAR(b.reports[0].loss, full.reports[3].loss, 1e-12 * full.reports[3].loss);
    EXPECT_NEAR(b.reports[1].loss, full.reports[4].loss, 1e-5 * full.reports[4].loss);
    EXPECT_LT(diff, 1e-2 * 3e-3);
  }
  // The steps after the resume moved the parameters.
  EXPECT_FALSE(same_prefix(b.params, b.loaded, n));
}

INSTANTIATE_TEST_SUITE_P(Reshard, ZeroCheckpointOtherRanks,
                         ::testing::Values(Reshard{2, 1, 4, 1, false}, Reshard{4, 1, 2, 1, false},
                                           Reshard{2, 1, 1, 0, false}, Reshard{1, 0, 2, 1, false},
                                           Reshard{2, 2, 4, 2, false}, Reshard{4, 2, 2, 2, false},
                                           Reshard{2, 2, 1, 0, false}, Reshard{1, 0, 2, 2, false},
                                           Reshard{4, 2, 2, 0, false}, Reshard{2, 0, 4, 1, false},
                                           Reshard{2, 0, 2, 1, true}),
                         [](const ::testing::TestParamInfo<Reshard>& i) {
                           return std::to_string(i.param.from) + "ranks_stage" +
                                  std::to_string(i.param.from_stage) + "_to_" +
                                  std::to_string(i.param.to) + "ranks_stage" +
                                  std::to_string(i.param.to_stage);
                         });

// Loads a checkpoint on `world` ranks of ZeRO `stage`; returns each rank's status, and checks
// that a failed load left every rank's trainer as it was (step 0, the initial weights).
std::vector<Status> load_on(int world, int stage, const std::string& path,
                            const GptConfig& model = zero_config()) {
  const TrainConfig c = parse(config_json(world, 1, stage, "", kFp16), world);
  return run_thread_ranks(world, [&](Communicator& comm) -> Status {
    std::unique_ptr<Trainer> t;
    Status s = make_trainer(c, &comm, {}, &t, model);
    if (!s.ok()) return s;
    const Status load = t->load_checkpoint(path);
    if (!load.ok()) {
      EXPECT_EQ(t->global_step(), 0);
      std::vector<float> p, init(static_cast<size_t>(t->model().layout().total));
      init_gpt_parameters(model, t->model().layout(), init.data());
      if (!(s = t->master_parameters(&p)).ok()) return s;
      EXPECT_TRUE(p == init) << "a failed load changed the weights";
    }
    return load;
  });
}

void expect_all_fail(const std::vector<Status>& st, const std::vector<std::string>& words) {
  for (size_t r = 0; r < st.size(); ++r) {
    EXPECT_FALSE(st[r].ok()) << "rank " << r;
    for (const std::string& w : words) {
      EXPECT_NE(st[r].message().find(w), std::string::npos)
          << "rank " << r << ": \"" << w << "\" not in: " << st[r].message();
    }
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// A copy of checkpoint folder `from` at `to` whose manifest has `key`'s value `old` replaced.
std::string edited_copy(const std::string& from, const std::string& to, const std::string& key,
                        const std::string& old_value, const std::string& new_value) {
  std::filesystem::remove_all(to);
  std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
  std::string text = read_text(to + "/manifest.json");
  const std::string a = "\"" + key + "\": " + old_value;
  const size_t at = text.find(a);
  EXPECT_NE(at, std::string::npos) << a << " not in " << text;
  if (at != std::string::npos) text.replace(at, a.size(), "\"" + key + "\": " + new_value);
  write_text(to + "/manifest.json", text);
  return to;
}

// Every way a checkpoint folder can be wrong is refused on every rank with the file and the
// problem named, and a failed load changes nothing.
TEST(ZeroCheckpointErrors, NameTheFileAndTheProblem) {
  const std::string dir = ckpt_dir("errors"), later = ckpt_dir("errors_later");
  Segment seg;
  seg.steps = 1;
  seg.save = dir;
  run_segment(2, 1, 2, seg);
  seg.steps = 2;
  seg.save = later;
  run_segment(2, 1, 2, seg);
  ASSERT_TRUE(load_on(2, 1, dir)[0].ok());  // the folder itself loads
  const std::string shard1 = "shard-00001-of-00002.ckpt";

  // A missing shard file: every rank names it, also those that do not need it (4 ranks: rank 0
  // reads only shard 0), and one rank.
  const std::string missing = ckpt_dir("missing");
  std::filesystem::copy(dir, missing, std::filesystem::copy_options::recursive);
  std::filesystem::remove(missing + "/" + shard1);
  for (int world : {1, 2, 4}) {
    SCOPED_TRACE(std::to_string(world) + " ranks");
    expect_all_fail(load_on(world, 1, missing),
                    {"missing shard file \"" + missing + "/" + shard1 + "\"", "rank 1 of 2"});
  }
  // No manifest: an unfinished save.
  const std::string unfinished = ckpt_dir("unfinished");
  std::filesystem::copy(dir, unfinished, std::filesystem::copy_options::recursive);
  std::filesystem::remove(unfinished + "/manifest.json");
  expect_all_fail(load_on(2, 2, unfinished), {unfinished, "no readable manifest.json"});
  // A shard of another save: only rank 1 reads it; it names the file, rank 0 names rank 1.
  const std::string mixed = ckpt_dir("mixed");
  std::filesystem::copy(dir, mixed, std::filesystem::copy_options::recursive);
  std::filesystem::copy_file(later + "/" + shard1, mixed + "/" + shard1,
                             std::filesystem::copy_options::overwrite_existing);
  std::vector<Status> st = load_on(2, 1, mixed);
  expect_all_fail(st, {});
  EXPECT_NE(st[1].message().find(mixed + "/" + shard1), std::string::npos) << st[1].message();
  EXPECT_NE(st[1].message().find("saved at global step 2"), std::string::npos) << st[1].message();
  EXPECT_NE(st[0].message().find("rank 1 failed while reading"), std::string::npos)
      << st[0].message();
  // A manifest that does not match the model, or this build.
  const std::string params = std::to_string(unpadded_total());
  expect_all_fail(
      load_on(2, 1, edited_copy(dir, ckpt_dir("params"), "parameters", params, params + "16")),
      {"manifest.json", "flat space of " + params + "16", "this run's model has " + params});
  expect_all_fail(load_on(2, 1, edited_copy(dir, ckpt_dir("version"), "version", "2", "3")),
                  {"manifest.json", "has version 3", "reads checkpoint folders of version 2"});
  expect_all_fail(load_on(4, 2, edited_copy(dir, ckpt_dir("stage"), "zero_stage", "1", "3")),
                  {"manifest.json", "ZeRO stage 3", "cannot be converted"});
  expect_all_fail(load_on(2, 1, edited_copy(dir, ckpt_dir("bounds"), "begin", "0", "16")),
                  {"manifest.json", "does not continue the shards before it"});
  // Another model of the same size (another seed): the replicated file says so.
  GptConfig other = zero_config();
  other.seed = 8;
  expect_all_fail(load_on(2, 1, dir, other),
                  {dir + "/replicated.ckpt", "was written for another model"});
  // One file of a folder given as the checkpoint.
  expect_all_fail(load_on(2, 1, dir + "/" + shard1), {shard1, "one file of a checkpoint folder"});
  // Saving over a regular file with several ranks: a folder is needed.
  const std::string file = ckpt_dir("a_file");
  write_text(file, "x");
  const TrainConfig c = parse(config_json(2, 1, 1), 2);
  st = run_thread_ranks(2, [&](Communicator& comm) {
    std::unique_ptr<Trainer> t;
    Status s = make_trainer(c, &comm, {}, &t);
    return s.ok() ? t->save_checkpoint(file) : s;
  });
  EXPECT_NE(st[0].message().find("is not a folder"), std::string::npos) << st[0].message();
  EXPECT_NE(st[1].message().find("rank 0 failed while preparing"), std::string::npos)
      << st[1].message();
}

}  // namespace
}  // namespace sciattn::train
