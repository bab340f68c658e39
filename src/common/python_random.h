// PythonRandom: a bit-exact copy of CPython's module-level `random` generator (MT19937), for the
// random blocks of the BigBird and Variable layouts. Host-only common layer (sciattn::detail).
#pragma once

#include <cstdint>
#include <vector>

#include "sciattn/status.h"

namespace sciattn::detail {

// Reproduces `random.seed(int)`, `random.getrandbits(k)`, `random._randbelow(n)` (what
// `randrange(n)` calls) and `random.sample(range(n), k)` of CPython 3.x, so that a layout drawn
// here equals DeepSpeed's after `random.seed(seed)` (spec block_sparse.md section 1.8). The
// generator is the reference MT19937 of Matsumoto and Nishimura; CPython seeds it with
// `init_by_array` on the 32-bit words of |seed|.
class PythonRandom {
 public:
  static constexpr int kStateWords = 624;  // MT19937 state size (N in the reference code)

  explicit PythonRandom(uint64_t seed = 0) { seed_uint(seed); }

  // random.seed(s) for s = seed (or s = -seed: CPython uses |s|).
  void seed_uint(uint64_t seed);
  // random.seed(s) for an integer |s| of any size, given as 32-bit words, least significant
  // first; an empty list means s = 0. Leading zero words must already be stripped, as CPython
  // does (s = 2^32 is {0, 1}, not {0, 1, 0}).
  void seed_words(const std::vector<uint32_t>& words);

  // The next tempered 32-bit output of MT19937.
  uint32_t next_uint32();
  // random.getrandbits(k), 0 <= k <= 64.
  uint64_t getrandbits(int k);
  // random._randbelow(n): uniform in [0, n) by rejection on getrandbits(bit_length(n)); n >= 1.
  uint64_t randbelow(uint64_t n);
  // random.sample(range(n), k), including CPython's choice between its "pool" and "set"
  // methods, which consume different draws. Fails like CPython when k > n or k < 0.
  Status sample_range(int64_t n, int64_t k, std::vector<int64_t>* out);

 private:
  void init_genrand(uint32_t s);
  void init_by_array(const std::vector<uint32_t>& key);
  void regenerate();

  uint32_t state_[kStateWords] = {};
  int index_ = kStateWords + 1;
};

// CPython's switch between the two sample methods: the pool method copies the population, so
// it is used while n is at most the memory of a small set (21 slots, plus a hash table of
// 4^ceil(log4(3k)) slots when k > 5). Exposed for the tests of the boundary.
int64_t python_sample_setsize(int64_t k);

}  // namespace sciattn::detail
