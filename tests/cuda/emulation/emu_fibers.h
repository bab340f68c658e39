// Cooperative threads for the host emulators (test layer, developer tools): emu_runtime.h (the
// attention kernels) and ops_emulation/ops_emu_runtime.h (the block-sparse ops) run each emulated
// CUDA thread of a CTA as a fiber on the launching thread. A fiber runs until it waits at a
// Barrier, then hands control back to run_fibers, which resumes the fibers round-robin (so between
// two barriers the threads run in index order). Waiting costs a user-level switch instead of an OS
// thread's sleep and wake-up: with one std::thread per CUDA thread the barriers of every mma.sync,
// shuffle and ldmatrix made the emulation spend most of its time in the operating system.
//
// The switch: on x86-64 it saves the callee-saved registers and the SSE / x87 control words on the
// running stack and loads the other stack, without a system call; elsewhere it is glibc's
// swapcontext, which also saves the signal mask (one system call per switch, which made switching
// most of an x86-64 run's time).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <sys/mman.h>

#if defined(__x86_64__)

// emu_switch_stack(save, load): pushes rbp, rbx, r12-r15 and an 8-byte slot with MXCSR and the
// x87 control word, stores rsp in *save, switches to `load`, and pops the same frame from it.
extern "C" void emu_switch_stack(void** save, void* load);
asm(R"(
  .text
  .weak emu_switch_stack
  .type emu_switch_stack, @function
  .p2align 4
emu_switch_stack:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch_stack, .-emu_switch_stack
)");

namespace emu {
struct FiberContext {
  void* sp = nullptr;
};
// Makes `context` start `entry` (which must never return) on the stack [stack, stack + size):
// the frame emu_switch_stack pops, with `entry` as its return address and the stack aligned as
// at a function's entry (rsp + 8 a multiple of 16).
inline void start_context(FiberContext& context, unsigned char* stack, size_t size,
                          void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t{15};
  auto* slot = reinterpret_cast<uint64_t*>(top);
  *--slot = 0;                                  // entry's return address: none
  *--slot = reinterpret_cast<uint64_t>(entry);  // popped by ret
  for (int r = 0; r < 6; ++r) *--slot = 0;      // rbp, rbx, r12-r15
  *--slot = uint64_t{0x037F} << 32 | 0x1F80;    // x87 control word, MXCSR: the defaults
  context.sp = slot;
}
inline void switch_context(FiberContext& from, FiberContext& to) {
  emu_switch_stack(&from.sp, to.sp);
}
}  // namespace emu

#else
#include <ucontext.h>

namespace emu {
struct FiberContext {
  ucontext_t context;
};
inline void start_context(FiberContext& context, unsigned char* stack, size_t size,
                          void (*entry)()) {
  getcontext(&context.context);
  context.context.uc_stack.ss_sp = stack;
  context.context.uc_stack.ss_size = size;
  context.context.uc_link = nullptr;
  makecontext(&context.context, entry, 0);
}
inline void switch_context(FiberContext& from, FiberContext& to) {
  swapcontext(&from.context, &to.context);
}
}  // namespace emu
#endif

namespace emu {

// The fiber running now, the scheduler's context, and the events that show progress: arrivals at
// barriers and finished fibers (a scheduler pass without one is a deadlock).
struct FiberSlot {
  FiberContext context;
  unsigned char* stack = nullptr;  // kFiberStack bytes above a guard page
  bool finished = false;
};
constexpr size_t kFiberStack = size_t{1} << 19;
inline std::vector<FiberSlot> fiber_slots;
inline FiberSlot* running_fiber = nullptr;
inline FiberContext fiber_scheduler;
inline uint64_t fiber_events = 0;

inline void yield_fiber() {
  switch_context(running_fiber->context, fiber_scheduler);
}

// A barrier of `expected` fibers: the last to arrive opens the phase and goes on; the others yield
// until it is open.
class Barrier {
 public:
  explicit Barrier(int expected = 0) : expected_(expected) {}
  void reset(int expected) {
    expected_ = expected;
    arrived_ = 0;
  }
  void arrive_and_wait() {
    const uint64_t phase = phase_;
    ++fiber_events;
    if (++arrived_ == expected_) {
      arrived_ = 0;
      ++phase_;
      return;
    }
    while (phase_ == phase) yield_fiber();
  }

 private:
  int expected_ = 0, arrived_ = 0;
  uint64_t phase_ = 0;
};

// The stack of a fiber slot, made at its first use: kFiberStack bytes above a page that faults on
// access (a kernel frame that overflows stops the run instead of writing over another fiber's).
inline unsigned char* fiber_stack(FiberSlot& f) {
  if (f.stack == nullptr) {
    const size_t page = 4096;
    void* at = mmap(nullptr, kFiberStack + page, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (at == MAP_FAILED || mprotect(at, page, PROT_NONE) != 0) {
      std::perror("emulator: a fiber stack");
      std::abort();
    }
    f.stack = static_cast<unsigned char*>(at) + page;
  }
  return f.stack;
}

// The body the fibers of the current run_fibers call run, and their entry point, which runs it,
// marks the fiber finished and hands control back for good.
inline void (*fiber_body)(const void*, int) = nullptr;
inline const void* fiber_body_state = nullptr;
inline int fiber_index = 0;  // the fiber being resumed
inline void fiber_main() {
  fiber_body(fiber_body_state, fiber_index);
  running_fiber->finished = true;
  ++fiber_events;
  yield_fiber();
  std::abort();  // a finished fiber is never resumed
}

// Runs body(i) as fiber i for i in [0, count) until every one has returned: round-robin, each
// resumed until it waits at a Barrier or returns, enter(i) called before each resume (to set what
// the running thread reads: its indexes). A pass in which no fiber arrives at a barrier or returns
// is a deadlock (a barrier some threads never reach): the run stops naming `what`.
template <typename Enter, typename Body>
void run_fibers(int count, const Enter& enter, const Body& body, const char* what) {
  if (fiber_slots.size() < static_cast<size_t>(count)) fiber_slots.resize(count);
  fiber_body = [](const void* state, int i) { (*static_cast<const Body*>(state))(i); };
  fiber_body_state = &body;
  for (int i = 0; i < count; ++i) {
    FiberSlot& f = fiber_slots[static_cast<size_t>(i)];
    f.finished = false;
    start_context(f.context, fiber_stack(f), kFiberStack, fiber_main);
  }
  for (int live = count; live > 0;) {
    const uint64_t before = fiber_events;
    for (int i = 0; i < count; ++i) {
      FiberSlot& f = fiber_slots[static_cast<size_t>(i)];
      if (f.finished) continue;
      running_fiber = &f;
      fiber_index = i;
      enter(i);
      switch_context(fiber_scheduler, f.context);
      if (f.finished) --live;
    }
    if (live > 0 && fiber_events == before) {
      std::fprintf(stderr,
                   "emulator: deadlock in %s: %d threads wait at barriers the others never "
                   "reach\n",
                   what, live);
      std::abort();
    }
  }
  running_fiber = nullptr;
}

}  // namespace emu
