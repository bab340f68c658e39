// How many threads the CPU paths choose (common/cpu_threads.h and the ops' work models): never
// more than the tasks or the limit, one below the measured minimum of work per thread. A wrong
// choice passes every result test (results do not depend on the thread count), so it is tested
// here on its own.
#include <gtest/gtest.h>

#include <cstdint>

#include "common/cpu_threads.h"
#include "common/evoformer_cpu_tiling.h"
#include "cpu/block_sparse_tiles.h"

namespace sciattn::detail {
namespace {

// Work of kCpuMinThreadNs at one FLOP per ns.
constexpr double kMin = kCpuMinThreadNs;

TEST(CpuLoopThreads, OneThreadBelowTwiceTheMinimumWork) {
  EXPECT_EQ(cpu_loop_threads(64, 1000, 0.0, 1.0), 1);
  EXPECT_EQ(cpu_loop_threads(64, 1000, kMin, 1.0), 1);
  EXPECT_EQ(cpu_loop_threads(64, 1000, 1.99 * kMin, 1.0), 1);
  EXPECT_EQ(cpu_loop_threads(64, 1000, 2 * kMin, 1.0), 2);
  EXPECT_EQ(cpu_loop_threads(64, 1000, 5.5 * kMin, 1.0), 5);
  // The same work at a higher rate is less time: fewer threads.
  EXPECT_EQ(cpu_loop_threads(64, 1000, 5.5 * kMin, 2.0), 2);
}

TEST(CpuLoopThreads, NeverMoreThanTheTasksOrTheLimit) {
  EXPECT_EQ(cpu_loop_threads(64, 3, 100 * kMin, 1.0), 3);
  EXPECT_EQ(cpu_loop_threads(2, 1000, 100 * kMin, 1.0), 2);
  EXPECT_EQ(cpu_loop_threads(1, 1000, 100 * kMin, 1.0), 1);
  // At least one thread, even for a loop without tasks or a limit below one.
  EXPECT_EQ(cpu_loop_threads(8, 0, 100 * kMin, 1.0), 1);
  EXPECT_EQ(cpu_loop_threads(0, 8, 100 * kMin, 1.0), 1);
  // Work that no int64 would hold does not overflow.
  EXPECT_EQ(cpu_loop_threads(16, int64_t{1} << 40, 1e30, 1.0), 16);
}

EvoformerShape shape(int64_t b, int64_t n, int64_t len, int64_t h, int64_t d) {
  return {b, n, len, h, d};
}

TEST(EvoformerCpuThreads, SmallShapesRunOnOneThread) {
  // The command-line program's default shape at D 24, 1.6 ms of one core: one thread however
  // many are allowed, forward and backward.
  const EvoformerShape cli = shape(1, 32, 33, 4, 24);
  EXPECT_EQ(cpu_forward_threads(2, cli), 1);
  EXPECT_EQ(cpu_forward_threads(64, cli), 1);
  EXPECT_EQ(cpu_backward_threads(64, cli, true), 1);
  EXPECT_EQ(cpu_backward_threads(64, cli, false), 1);
  // One (b, n, h) is one task.
  EXPECT_EQ(cpu_forward_threads(64, shape(1, 1, 1024, 1, 64)), 1);
}

TEST(EvoformerCpuThreads, ThreadsFollowTheWork) {
  // [1, 8, L, 4, 32] has 32 * L^2 scores of 4*32 + 128 = 256 forward units, at 40 per ns: a
  // second thread from 6 ms, which L 172 reaches and L 171 does not.
  EXPECT_EQ(cpu_forward_threads(64, shape(1, 8, 171, 4, 32)), 1);
  EXPECT_EQ(cpu_forward_threads(64, shape(1, 8, 172, 4, 32)), 2);
  // The backward's 10*32 + 128 units per score at L 160: 9.2 ms, three threads.
  EXPECT_EQ(cpu_backward_threads(64, shape(1, 8, 160, 4, 32), false), 3);
  // The benchmark's demo triangle shape [1, 128, 128, 4, 32] has 512 tasks and 53.7 ms of work:
  // 17 threads' worth.
  const EvoformerShape triangle = shape(1, 128, 128, 4, 32);
  EXPECT_EQ(cpu_forward_threads(2, triangle), 2);
  EXPECT_EQ(cpu_forward_threads(16, triangle), 16);
  EXPECT_EQ(cpu_forward_threads(1000, triangle), 17);
}

TEST(EvoformerCpuThreads, BackwardTasksFollowTheDbias2Chunks) {
  // With dbias2 the tasks are (b, h, chunk of N), at most 8 chunks: [2, 64, 256, 4, 32] has
  // 2 * 4 * 8 = 64 tasks and work for 125 threads.
  const EvoformerShape s = shape(2, 64, 256, 4, 32);
  EXPECT_EQ(cpu_backward_chunks(s, true), 8);
  EXPECT_EQ(cpu_backward_threads(1000, s, true), 64);
  // Without dbias2 every (b, n, h) is a task: 512, and the work decides.
  EXPECT_EQ(cpu_backward_chunks(s, false), 64);
  EXPECT_EQ(cpu_backward_threads(1000, s, false), 125);
}

TEST(BlockSparseCpuThreads, ThreadsFollowTheBlocks) {
  // `sciattn sparse --len 64 --dim 32`: the Fixed layout of 4 heads is dense at 4 x 4 blocks of 16,
  // 64 blocks; the fused forward's 4*32 FLOP and an exponential per element are 4.2 M FLOP: one
  // thread.
  const double fused = 4.0 * 32 + kCpuExpFlops;
  EXPECT_EQ(cpu::block_loop_threads(2, 16, 64, 16, fused), 1);
  // 1024 blocks of 64 (L 4096, 4 heads, density 1/16): 1.07 G FLOP at 60 per ns, 17.9 ms: work
  // for 5 threads, so the limit, the work or the tasks decide.
  EXPECT_EQ(cpu::block_loop_threads(2, 256, 1024, 64, fused), 2);
  EXPECT_EQ(cpu::block_loop_threads(64, 256, 1024, 64, fused), 5);
  EXPECT_EQ(cpu::block_loop_threads(64, 4, 1024, 64, fused), 4);
}

}  // namespace
}  // namespace sciattn::detail
