// `sciattn train` and `sciattn data` run as a user would: the demo's loss falls; a run from a
// text file writes its log, plot and checkpoint and resumes; the offload flags give the same
// losses; --plan prints the memory arithmetic; bad input gets a message naming what the user wrote
// and a non-zero exit; --nproc-per-node and ranks started by a launcher train as one group. These
// runs name --device cpu (the default is cuda on a GPU machine). Test layer (cpu).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_runner.h"
#include "process_temp_dir.h"

namespace {

using Result = sciattn::testing::CommandResult;

Result run(const std::string& args, const std::string& prefix = "") {
  return sciattn::testing::run_cli(args, prefix);
}

std::string dir() {
  return sciattn::testing::process_temp_dir();
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void expect_contains(const Result& r, const std::string& fragment) {
  EXPECT_NE(r.output.find(fragment), std::string::npos) << "output lacks \"" << fragment << "\":\n"
                                                        << r.output;
}

// A small text corpus, the model and config files of a short run.
struct Files {
  std::string text = dir() + "corpus.txt", tokens = dir() + "corpus.tok",
              model = dir() + "gpt.json", config = dir() + "ds.json";
  Files() {
    std::string corpus;
    for (int i = 0; i < 60; ++i) {
      corpus += "the quick brown fox jumps over the lazy dog number " + std::to_string(i) + "\n";
    }
    write(text, corpus);
    write(model, R"({"vocab_size": 257, "d_model": 32, "n_layers": 2, "n_heads": 2,
                     "sequence_length": 24, "positions": "rotary", "tie_embeddings": false})");
    write(config, R"({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
      "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": 0.01}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 2, "warmup_max_lr": 2e-3,
                    "total_num_steps": "auto"}},
      "fp16": {"enabled": true, "initial_scale_power": 12},
      "gradient_clipping": {"type": "adaptive", "threshold": 1.0, "history_window": 4},
      "zero_optimization": {"stage": 0, "overlap_comm": true},
      "wall_clock_breakdown": true})");
  }
};

TEST(TrainCli, DemoLossFalls) {
  const Result r = run("train --demo --threads 2 --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r, "loss fell from");
  expect_contains(r, "step 60/60");
}

TEST(TrainCli, TextRunLogsPlotsSavesAndResumes) {
  Files f;
  Result r = run("data --text " + f.text + " --lines --shuffle --seed 3 --out " + f.tokens);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r, "60 documents");
  expect_contains(r, "documents shuffled with seed 3");
  const std::string log = dir() + "run.jsonl", plot = dir() + "loss.png", ckpt = dir() + "run.ckpt";
  const std::string base = "train --device cpu --config " + f.config + " --model " + f.model +
                           " --data " + f.tokens +
                           " --lr 1e-3 --token-chunk 8 --lm-head-tile-tokens 16 ";
  r = run(base + "--steps 3 --save " + ckpt + " --log " + log + " --plot " + plot +
          " --memory --inject-overflow 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r, "warning: DeepSpeed config");
  expect_contains(r, "zero_optimization.overlap_comm");
  expect_contains(r, "fp16.enabled is true, but the CPU path computes in fp32");
  expect_contains(r, "memory ledger:");
  expect_contains(r, "SKIPPED (gradients overflowed at loss scale 4096)");
  expect_contains(r, "fwd+bwd");
  expect_contains(r, "saved " + ckpt + " at step 3");
  // One JSON record per step.
  std::ifstream in(log);
  std::string line;
  int records = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j["step"].get<int>(), ++records);
    EXPECT_TRUE(j.contains("tokens_per_second"));
    EXPECT_EQ(j["skipped"].get<bool>(), records == 2);
  }
  EXPECT_EQ(records, 3);
  EXPECT_EQ(read(plot).substr(0, 4), "\x89PNG");
  // Resume: steps 4 and 5 only.
  r = run(base + "--steps 5 --resume " + ckpt);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r, "step 4/5");
  expect_contains(r, "step 5/5");
  EXPECT_EQ(r.output.find("step 3/5"), std::string::npos) << r.output;
}

// The offloads on the CPU path run the GPU's order of copies and the host AdamW; the losses of
// every step equal the plain run's exactly.
TEST(TrainCli, OffloadFlagsGiveTheSameLosses) {
  Files f;
  ASSERT_EQ(run("data --text " + f.text + " --lines --out " + f.tokens).exit_code, 0);
  const std::string base = "train --device cpu --config " + f.config + " --model " + f.model +
                           " --data " + f.tokens + " --lr 1e-3 --token-chunk 8 --steps 4 --log ";
  const std::string plain = dir() + "plain.jsonl", offloaded = dir() + "offloaded.jsonl";
  Result r = run(base + plain);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run(base + offloaded +
          " --offload-checkpoints --offload-optimizer --keep-attention-outputs --memory");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r, "checkpointing on, offloaded to host memory, attention outputs kept");
  expect_contains(r, "attention outputs kept (output and log-sum-exp)");
  expect_contains(r, "optimizer offloaded (CPU AdamW");
  expect_contains(r, "offloaded checkpoints (layer inputs 0 .. L-2)");
  std::ifstream a(plain), b(offloaded);
  std::string la, lb;
  int steps = 0;
  while (std::getline(a, la) && std::getline(b, lb)) {
    const nlohmann::json ja = nlohmann::json::parse(la), jb = nlohmann::json::parse(lb);
    EXPECT_EQ(ja["loss"], jb["loss"]) << "step " << ja["step"];
    EXPECT_EQ(ja["grad_norm"], jb["grad_norm"]) << "step " << ja["step"];
    ++steps;
  }
  EXPECT_EQ(steps, 4);
}

TEST(TrainCli, PlanPrintsTheArithmeticAndTheLongestSequence) {
  Files f;
  const Result r = run("train --plan --device cuda --config " + f.config + " --model " + f.model +
                       " --lr 1e-3 --steps 10 --device-memory-gib 0.25 --host-memory-gib 0.5 "
                       "--plan-max-tokens 1048576 "
                       "--plan-granularity 64 --mlp-tile-tokens 4096 --lm-head-tile-tokens 4096");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r, "memory plan: GPT");
  expect_contains(r, "24 tokens x micro-batch 2, f16 on cuda");
  expect_contains(r, "back end: cuBLASLt workspace");
  expect_contains(r, "): fits");
  expect_contains(r, "the longest sequence per technique");
  expect_contains(r, "+ checkpoint offload + optimizer offload");
}

// With a sparse config the search for the longest sequence stops where the layout can no longer
// be built (2 heads, block 16: [2, n, n] holds at most 2^32 blocks for n <= 46,340), and says so.
TEST(TrainCli, PlanStopsAtTheSparseLayoutsLimit) {
  const std::string config = dir() + "bigbird.json";
  write(config, R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,)"
                R"( "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},)"
                R"( "sparse_attention": {"mode": "bigbird", "block": 16}})");
  const std::string model = dir() + "gpt64.json";
  write(model, R"({"vocab_size": 257, "d_model": 32, "n_layers": 2, "n_heads": 2,)"
               R"( "sequence_length": 64, "positions": "rotary"})");
  const Result r = run("train --plan --device cuda --config " + config + " --model " + model +
                       " --steps 10 --device-memory-gib 1000 --host-memory-gib 1000 "
                       "--plan-max-tokens 1048576 --plan-granularity 64");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r, "per-layer checkpointing                                741440");
  expect_contains(r, "layouts of 2 heads and block 16 are built up to 741440 tokens");
}

// --plan --nproc-per-node N plans one of N ranks with the config's ZeRO stage: the shards, stage
// 2's group gradient buffers instead of the whole buffer, no optimizer-offload rows; it starts
// no ranks.
TEST(TrainCli, PlanForSeveralRanksShowsTheZeroBuffers) {
  Files f;
  const std::string config = dir() + "zero2.json";
  write(config, R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,)"
                R"( "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},)"
                R"( "zero_optimization": {"stage": 2, "reduce_bucket_size": 100}})");
  const Result r = run("train --plan --device cuda --nproc-per-node 2 --config " + config +
                       " --model " + f.model +
                       " --steps 10 --device-memory-gib 0.25 --host-memory-gib 0.5 "
                       "--plan-max-tokens 4096 --plan-granularity 64");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r, "one of 2 ranks, ZeRO stage 2");
  expect_contains(r, "gradients (f32): embeddings' group");
  expect_contains(r, "gradients (f32): layer buffer 0 of ");
  expect_contains(r, "ZeRO-2 shard: reduced gradients (f32, 1/2 of the layout)");
  expect_contains(r, "ZeRO shard: AdamW exp_avg, exp_avg_sq");
  EXPECT_EQ(r.output.find("optimizer offload"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("rank 1"), std::string::npos) << r.output;
}

// --plan with the config's sequence_parallel_size plans one rank of a sequence-parallel group
// (its share of each sequence, the all-to-all buffers); a search granularity that is not a whole
// number of slices is refused naming the flag.
TEST(TrainCli, PlanWithSequenceParallelismShowsOneRanksShare) {
  Files f;
  const std::string config = dir() + "sp2.json";
  write(config, R"({"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,)"
                R"( "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},)"
                R"( "sequence_parallel_size": 2})");
  const std::string base = "train --plan --device cuda --nproc-per-node 2 --config " + config +
                           " --model " + f.model +
                           " --steps 10 --device-memory-gib 0.25 --host-memory-gib 0.5 "
                           "--plan-max-tokens 4096 --plan-granularity ";
  Result r = run(base + "64");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r,
                  "one of 2 ranks, ZeRO stage 0, sequence-parallel groups of 2 (12 tokens of "
                  "each sequence per rank)");
  expect_contains(r, "sequence-parallel all-to-all buffers");
  expect_contains(r, "the longest sequence per technique");
  r = run(base + "63");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  expect_contains(r, "--plan-granularity 63 must be a multiple of sequence_parallel_size 2");
}

TEST(TrainCli, CudaWithoutAGpuSaysSoAtOnce) {
  Files f;
  const Result r = run("train --device cuda --demo --steps 1");
  if (r.exit_code == 0) GTEST_SKIP() << "this machine trains on a GPU";
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r, "--device cuda: ");
  EXPECT_EQ(r.output.find("step 1"), std::string::npos) << r.output;
}

TEST(TrainCli, FastaBecomesCodons) {
  const std::string fasta = dir() + "genes.fasta", out = dir() + "genes.tok";
  write(fasta, ">g1\nATGAAACCCGG\n>g2\nNNNTTT\n");
  const Result r = run("data --fasta " + fasta + " --out " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r, "2 documents, 7 tokens (codons, vocabulary 66");
  expect_contains(r, "1 with letters other than ACGTU), 2 trailing bases dropped");
  EXPECT_EQ(read(out).substr(0, 8), "SCIATOKN");
}

TEST(TrainCli, BadInputIsNamed) {
  Files f;
  ASSERT_EQ(run("data --text " + f.text + " --out " + f.tokens).exit_code, 0);
  const std::string files = " --model " + f.model + " --data " + f.tokens + " --steps 1";
  Result r = run("train --model " + f.model);
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r, "missing --config --data");
  const std::string bad = dir() + "bad.json";
  write(bad, R"({"train_batch_size": 2, "gradient_clippin": 1.0})");
  r = run("train --config " + bad + files);
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r, "gradient_clippin is not a DeepSpeed config key");
  write(bad, R"({"train_batch_size": 6, "train_micro_batch_size_per_gpu": 4})");
  r = run("train --config " + bad + files);
  expect_contains(r, "train_batch_size 6 != train_micro_batch_size_per_gpu 4");
  write(bad, R"({"vocab_size": 257, "d_model": 32, "n_layer": 2})");
  r = run("train --config " + f.config + " --model " + bad + " --data " + f.tokens + " --steps 1");
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r, "unknown key \"n_layer\"");
  r = run("train --config " + f.config + " --model " + f.model + " --data " + f.text +
          " --steps 1 --lr 1e-3");
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r, "corpus.txt\" does not start with the magic");
  r = run("train --config " + f.config + files);
  expect_contains(r, "optimizer.params.lr is \"auto\"");
  r = run("train --config " + f.config + files + " --lr 1e-3 --save-every 2");
  expect_contains(r, "--save-every needs --save");
  r = run("data --out " + f.tokens);
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r, "exactly one of --text");
  r = run("train --demo --resume " + f.config);
  EXPECT_NE(r.exit_code, 0);
  expect_contains(r, "does not start with the magic \"SCIACKPT\"");
  r = run("train --config " + f.config + files + " --lr 1e-3 --keep-attention-layers two");
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r, "--keep-attention-layers two: give a number of layers >= 0 or auto");
  r = run("train --config " + f.config + files +
          " --lr 1e-3 --keep-attention-outputs --keep-attention-layers 1");
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r, "give one of --keep-attention-outputs (every layer) and");
}

// --keep-attention-layers: a count (the last N layers), or auto, the most the plan fits (here
// every layer of 2, in the host budget given).
TEST(TrainCli, KeepAttentionLayersCountOrAuto) {
  Files f;
  ASSERT_EQ(run("data --text " + f.text + " --lines --out " + f.tokens).exit_code, 0);
  const std::string base = "train --device cpu --config " + f.config + " --model " + f.model +
                           " --data " + f.tokens + " --lr 1e-3 --steps 1 --checkpoint-layers";
  Result r = run(base + " --keep-attention-layers 1 --memory");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r, "attention outputs kept (1 of 2 layers)");
  expect_contains(r, "attention outputs kept (output and log-sum-exp), 1 x");
  r = run("train --device cpu --config " + f.config + " --model " + f.model + " --data " +
          f.tokens + " --lr 1e-3 --steps 1 --keep-attention-outputs");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r, "without checkpointing (--checkpoint-layers, or the config's");
  r = run(base + " --keep-attention-layers auto --host-memory-gib 100");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r,
                  "attention outputs kept (2 of 2 layers; auto: the most the plan fits in "
                  "100.00 GiB (--host-memory-gib))");
  r = run("train --plan --device cuda --config " + f.config + " --model " + f.model +
          " --lr 1e-3 --steps 1 --checkpoint-layers --keep-attention-layers auto "
          "--device-memory-gib 100 --plan-max-tokens 4096 --plan-granularity 64");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r,
                  "attention outputs kept for 2 of 2 layers (auto: the most the plan fits in "
                  "98.00 GiB (--device-memory-gib, less 2 GiB))");
  // Offloaded with the checkpoints, the outputs are host memory: auto names that budget too.
  r = run("train --plan --device cuda --config " + f.config + " --model " + f.model +
          " --lr 1e-3 --steps 1 --offload-checkpoints --keep-attention-layers auto "
          "--offload-attention-outputs --device-memory-gib 100 --host-memory-gib 50 "
          "--plan-max-tokens 4096 --plan-granularity 64");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r,
                  "attention outputs kept for 2 of 2 layers (auto: the most the plan fits in "
                  "98.00 GiB (--device-memory-gib, less 2 GiB) and 50.00 GiB (--host-memory-gib) "
                  "of host memory)");
  expect_contains(r, "attention outputs kept, in use (output and log-sum-exp), 2 x");
}

// --offload-attention-outputs: with offloaded checkpoints, the kept outputs' summary says so and
// the ledger has the two slots in use (here every layer of 2: nothing leaves); without offloaded
// checkpoints it warns that it does nothing.
TEST(TrainCli, OffloadAttentionOutputsNeedsOffloadedCheckpoints) {
  Files f;
  ASSERT_EQ(run("data --text " + f.text + " --lines --out " + f.tokens).exit_code, 0);
  const std::string base =
      "train --device cpu --config " + f.config + " --model " + f.model + " --data " + f.tokens +
      " --lr 1e-3 --steps 1 --keep-attention-outputs --offload-attention-outputs";
  Result r = run(base + " --offload-checkpoints --memory");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r, "attention outputs kept (2 of 2 layers, offloaded)");
  expect_contains(r, "attention outputs kept, in use (output and log-sum-exp), 2 x");
  r = run(base + " --checkpoint-layers");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r, "warning: --offload-attention-outputs moves kept attention outputs to host");
}

// A TCP port nobody listened on a moment ago, for a group started by hand.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::vector<nlohmann::json> records(const std::string& log) {
  std::ifstream in(log);
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

// Two ranks started by --nproc-per-node on the CPU (the TCP test communicator) train the same
// global batches as one rank accumulating two micro-batches: the losses agree to rounding (the
// two add the micro-batches in another order), only rank 0 prints, and a checkpoint folder is
// written by both.
TEST(TrainCli, NprocPerNodeOnTheCpuEqualsOneRankWithAccumulation) {
  Files f;
  ASSERT_EQ(run("data --text " + f.text + " --lines --out " + f.tokens).exit_code, 0);
  const std::string base = "train --device cpu --config " + f.config + " --model " + f.model +
                           " --data " + f.tokens +
                           " --lr 1e-3 --token-chunk 8 --steps 4 --threads 1 --log ";
  const std::string one = dir() + "one.jsonl", two = dir() + "two.jsonl", ckpt = dir() + "two.ckpt";
  Result r = run(base + one);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r, "batch 4 = micro 2 x 2 accumulation");
  r = run(base + two + " --nproc-per-node 2 --save " + ckpt);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r, "batch 4 = micro 2 x 1 accumulation");
  expect_contains(r, "2 ranks (RANK), one process each, the TCP test communicator");
  // Rank 0 alone prints the progress lines (and the warnings).
  EXPECT_EQ(r.output.find("step 1/4"), r.output.rfind("step 1/4")) << r.output;
  expect_contains(r, "saved " + ckpt + " at step 4");
  EXPECT_FALSE(read(ckpt + "/manifest.json").empty());
  EXPECT_FALSE(read(ckpt + "/shard-00001-of-00002.ckpt").empty());
  const std::vector<nlohmann::json> a = records(one), b = records(two);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t k = 0; k < a.size(); ++k) {
    const double la = a[k]["loss"].get<double>(), lb = b[k]["loss"].get<double>();
    EXPECT_NEAR(la, lb, 1e-5 * la) << "step " << k + 1;
    EXPECT_EQ(a[k]["tokens"], b[k]["tokens"]);
    EXPECT_EQ(a[k]["skipped"], b[k]["skipped"]);
  }
}

// torchrun's way: each process is started with its RANK, WORLD_SIZE and rank 0's address, and
// joins the group (here rank 1 in the background, rank 0 in the foreground).
TEST(TrainCli, ProcessesStartedByALauncherJoinAsTheirRanks) {
  const int port = free_port();
  const std::string group =
      "export WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + "; ";
  const std::string args = "train --demo --device cpu --threads 1 --steps 60";
  const Result r = run(args, group + "RANK=1 LOCAL_RANK=1 " + SCIATTN_CLI_PATH + " " + args +
                                 " >/dev/null 2>&1 & RANK=0 LOCAL_RANK=0 ");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_contains(r, "2 ranks (RANK)");
  expect_contains(r, "batch 8 = micro 4 x 1 accumulation");
  expect_contains(r, "loss fell from");
}

TEST(TrainCli, NprocPerNodeForwardsTheRanksFailure) {
  // 4 ranks cannot split the demo's batch of 8 into micro-batches of 4: the ranks refuse the
  // demo's config (exit status 1), the launcher stops the others and exits with that status.
  const Result r = run("train --demo --device cpu --threads 1 --nproc-per-node 4");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  expect_contains(r, "data-parallel ranks 4");
  expect_contains(r, "failed (exit status 1)");
  EXPECT_EQ(r.output.find("sciattn trainsciattn"), std::string::npos) << r.output;
}

// One rank fails before it joins the group while rank 0 waits for it in the rendezvous (for up to
// 300 s): the launcher stops rank 0 and exits with the failed rank's status, within seconds.
TEST(TrainCli, NprocPerNodeStopsTheOthersWhenOneRankFails) {
  const auto start = std::chrono::steady_clock::now();
  const Result r =
      run("train --demo --device cpu --threads 1 --nproc-per-node 2 --test-fail-rank 1");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 3) << r.output;
  expect_contains(r, "sciattn train (rank 1): --test-fail-rank 1: failing");
  expect_contains(r, "rank 1 failed (exit status 3); stopping the other 1 rank(s)");
  EXPECT_LT(seconds, 9.0);
}

TEST(TrainCli, LauncherVariablesAreChecked) {
  Result r = run("train --demo --device cpu --nproc-per-node 2",
                 "RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 ");
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r, "leave out --nproc-per-node");
  r = run("train --demo --device cpu", "RANK=x WORLD_SIZE=2 ");
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r, "RANK=\"x\" is not a decimal integer");
  r = run("train --demo --device cpu", "RANK=1 WORLD_SIZE=2 ");
  EXPECT_EQ(r.exit_code, 2);
  expect_contains(r, "MASTER_ADDR");
}

}  // namespace
