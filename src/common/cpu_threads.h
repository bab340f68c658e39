// How many threads a CPU parallel loop runs on: no more than its work keeps busy. Host-only common
// layer (a heuristic the CPU paths of every op share).
//
// A thread costs little to start on an idle machine (microseconds), but a parallel loop ends only
// when every thread of its team has arrived, and on a busy machine a woken thread waits for a
// core: on the 2-core CPU machine with other builds running, every two-thread loop took one or
// two scheduler ticks (4-8 ms) however little it did, so a 1.6 ms Evoformer forward took 8-12 ms
// and a 4.4 ms forward + backward (four loops) 31-48 ms. A thread therefore joins a loop only when
// its share of the work is kCpuMinThreadNs of one core or more. At that threshold either wrong
// choice costs about twice the time: one thread on an idle machine takes 6 ms where two would
// take 3, two threads on a busy one take 10-14 ms where one would take 6. The thread count never
// changes a result (every task owns its outputs), so the choice may follow the shape.
#pragma once

#include <algorithm>
#include <cstdint>

namespace sciattn::detail {

// Work is counted in FLOP as the ops' reports count them (a multiply-add is 2), plus
// kCpuExpFlops per exponential and kCpuFloatMoveFlops per float a loop that mostly moves data
// reads or writes. Each op family turns its count into time at its own measured rate.
//
// An exponential with its softmax bookkeeping (the row maximum, the sum, the normalisation, the
// per-key loop overhead around the head-dim products) costs as long as about 128 FLOP of those
// products: the tiled Evoformer forward on one core of the 2-core CPU machine (AMD EPYC, its
// AVX-512 clone) took 7.05 ns per score at head dim 32 and 9.31 ns at 64 when the rates were
// fitted (src/common/evoformer_cpu_tiling.h).
constexpr double kCpuExpFlops = 128.0;
// A core streams roughly 10-20 GB/s from memory: a float as long as about 4 FLOP at 20 FLOP/ns
// (an estimate; it only decides when such a loop, rarely worth a second thread, gets one).
constexpr double kCpuFloatMoveFlops = 4.0;

// The least work a thread must get, in nanoseconds of one core: 3 ms, most of a 4 ms scheduler
// tick. Below twice this a loop runs on the calling thread alone.
constexpr double kCpuMinThreadNs = 3.0e6;

// Threads for a loop of `tasks` independent tasks that do `flops` of work in all at
// `flops_per_ns` on one core, with at most `limit` threads: no more than there are tasks, one per
// kCpuMinThreadNs of work, at least one. `flops` is a double so that no shape can overflow it.
inline int cpu_loop_threads(int limit, int64_t tasks, double flops, double flops_per_ns) {
  const double by_work = std::max(1.0, flops / flops_per_ns / kCpuMinThreadNs);
  const double threads =
      std::min({static_cast<double>(limit), static_cast<double>(tasks), by_work});
  return std::max(1, static_cast<int>(threads));
}

}  // namespace sciattn::detail
