// The host emulation's user-level context switch (test layer, a developer tool; emu_runtime.h runs
// each emulated CUDA thread as a fiber on it). On x86-64 a switch saves the callee-saved registers
// and the SSE / x87 control words on the running stack and loads the other stack: no system call.
// Elsewhere it is glibc's swapcontext, which also saves the signal mask (one system call per
// switch, which made switching most of an x86-64 run's time).
#pragma once
#include <cstddef>
#include <cstdint>

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
