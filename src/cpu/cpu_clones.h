// Compiling a CPU kernel's hot functions once per x86 instruction-set level. CPU layer.
//
// The task functions of the CPU kernels (one task = one output tile or slice, with every helper
// they call inlined) are compiled three times, for x86-64-v4 (AVX-512), x86-64-v3 (AVX2 + FMA)
// and the baseline, and the loader picks the best one the CPU runs (target_clones, an ifunc
// resolved once per process). Within one process every call runs the same clone, so results stay
// deterministic and independent of the thread count; between CPUs of different levels the last
// bits of a result can differ, because the v3 and v4 clones contract a * b + c into one FMA.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(SCIATTN_NO_CPU_CLONES)
#define SCIATTN_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define SCIATTN_CPU_INLINE inline __attribute__((always_inline))
#else
#define SCIATTN_CPU_CLONES
#define SCIATTN_CPU_INLINE inline
#endif
// Helpers called from a cloned function are forced inline: a helper the compiler keeps out of
// line would be the baseline version, called from every clone, and the wide clones would gain
// nothing.
