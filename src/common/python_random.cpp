// CPython-compatible MT19937 seeding, getrandbits, _randbelow and sample(range(n), k).
// Host-only common layer; written from the reference MT19937 description and spec section 1.8.
#include "common/python_random.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_set>

namespace sciattn::detail {
namespace {

// MT19937 constants from the reference implementation (mt19937ar.c).
constexpr int kShift = 397;  // M: distance of the word mixed into each regenerated word
constexpr uint32_t kMatrixA = 0x9908b0dfu;
constexpr uint32_t kUpperMask = 0x80000000u;
constexpr uint32_t kLowerMask = 0x7fffffffu;
// CPython always starts init_by_array from this fixed init_genrand seed.
constexpr uint32_t kArraySeed = 19650218u;

// Python's int.bit_length: 0 for 0. A count of leading zeros rather than a loop of up to 64
// shifts: randbelow calls it for every draw (thousands per BigBird layout).
int bit_length(uint64_t n) {
  return n == 0 ? 0 : 64 - __builtin_clzll(n);
}

}  // namespace

void PythonRandom::init_genrand(uint32_t s) {
  state_[0] = s;
  for (int i = 1; i < kStateWords; ++i) {
    const uint32_t prev = state_[i - 1];
    state_[i] = 1812433253u * (prev ^ (prev >> 30)) + static_cast<uint32_t>(i);
  }
  index_ = kStateWords;
}

void PythonRandom::init_by_array(const std::vector<uint32_t>& key) {
  init_genrand(kArraySeed);
  const size_t key_length = key.size();
  size_t i = 1;
  size_t j = 0;
  for (size_t k = key_length > kStateWords ? key_length : kStateWords; k > 0; --k) {
    const uint32_t prev = state_[i - 1];
    state_[i] =
        (state_[i] ^ ((prev ^ (prev >> 30)) * 1664525u)) + key[j] + static_cast<uint32_t>(j);
    ++i;
    ++j;
    if (i >= kStateWords) {
      state_[0] = state_[kStateWords - 1];
      i = 1;
    }
    if (j >= key_length) j = 0;
  }
  for (size_t k = kStateWords - 1; k > 0; --k) {
    const uint32_t prev = state_[i - 1];
    state_[i] = (state_[i] ^ ((prev ^ (prev >> 30)) * 1566083941u)) - static_cast<uint32_t>(i);
    ++i;
    if (i >= kStateWords) {
      state_[0] = state_[kStateWords - 1];
      i = 1;
    }
  }
  state_[0] = 0x80000000u;  // the reference guarantees a non-zero state this way
}

void PythonRandom::seed_uint(uint64_t seed) {
  // CPython splits |seed| into 32-bit words, least significant first, and keys with [0] for 0.
  std::vector<uint32_t> words;
  for (uint64_t n = seed; n != 0; n >>= 32) words.push_back(static_cast<uint32_t>(n));
  seed_words(words);
}

void PythonRandom::seed_words(const std::vector<uint32_t>& words) {
  if (words.empty()) {
    init_by_array({0u});
  } else {
    init_by_array(words);
  }
}

void PythonRandom::regenerate() {
  auto mix = [](uint32_t upper_word, uint32_t lower_word) {
    const uint32_t y = (upper_word & kUpperMask) | (lower_word & kLowerMask);
    return (y >> 1) ^ ((y & 1u) != 0 ? kMatrixA : 0u);
  };
  int kk = 0;
  for (; kk < kStateWords - kShift; ++kk) {
    state_[kk] = state_[kk + kShift] ^ mix(state_[kk], state_[kk + 1]);
  }
  for (; kk < kStateWords - 1; ++kk) {
    state_[kk] = state_[kk + kShift - kStateWords] ^ mix(state_[kk], state_[kk + 1]);
  }
  state_[kStateWords - 1] = state_[kShift - 1] ^ mix(state_[kStateWords - 1], state_[0]);
  index_ = 0;
}

uint32_t PythonRandom::next_uint32() {
  if (index_ >= kStateWords) regenerate();
  uint32_t y = state_[index_++];
  // Tempering, as in the reference.
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint64_t PythonRandom::getrandbits(int k) {
  if (k <= 0) return 0;  // CPython >= 3.9 returns 0 for getrandbits(0) without drawing
  if (k <= 32) return next_uint32() >> (32 - k);
  // CPython fills the result 32 bits at a time from the least significant word up, dropping
  // the low bits of the last (most significant) word.
  const uint64_t low = next_uint32();
  const int high_bits = (k > 64 ? 64 : k) - 32;
  const uint64_t high = next_uint32() >> (32 - high_bits);
  return low | (high << 32);
}

uint64_t PythonRandom::randbelow(uint64_t n) {
  if (n == 0) return 0;         // not reachable from sample(); CPython would raise
  const int k = bit_length(n);  // bit_length(n), not of n-1: n = 1 still draws, like CPython
  uint64_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return r;
}

int64_t python_sample_setsize(int64_t k) {
  int64_t setsize = 21;
  if (k > 5) {
    // CPython computes ceil(math.log(3k, 4)) in double precision: log(x) / log(4).
    const double exponent = std::ceil(std::log(static_cast<double>(k) * 3.0) / std::log(4.0));
    // 4^31 already exceeds any population an int64 can count; saturate instead of overflowing.
    if (exponent >= 31.0) return INT64_MAX;
    setsize += int64_t{1} << (2 * static_cast<int>(exponent));
  }
  return setsize;
}

Status PythonRandom::sample_range(int64_t n, int64_t k, std::vector<int64_t>* out) {
  if (k < 0 || k > n) {
    return Status::invalid_argument("Sample larger than population or is negative: sample(range(" +
                                    std::to_string(n) + "), " + std::to_string(k) + ")");
  }
  out->assign(static_cast<size_t>(k), 0);
  if (n <= python_sample_setsize(k)) {
    // Pool method: a partial Fisher-Yates shuffle that moves the last live element into the
    // slot just taken.
    std::vector<int64_t> pool(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pool[i] = i;
    for (int64_t i = 0; i < k; ++i) {
      const auto j = static_cast<int64_t>(randbelow(static_cast<uint64_t>(n - i)));
      (*out)[i] = pool[j];
      pool[j] = pool[n - i - 1];
    }
  } else {
    // Set method: draw from the whole population and redraw repeats. A few draws (BigBird's one
    // to three random blocks per row, thousands of rows) are checked against those taken so far
    // directly, and no hash set is made for them at all: building one per call was most of this
    // function's time. Same draws either way.
    constexpr int64_t kLinearCheck = 16;
    int64_t* taken = out->data();
    if (k <= kLinearCheck) {
      for (int64_t i = 0; i < k; ++i) {
        int64_t j;
        do {
          j = static_cast<int64_t>(randbelow(static_cast<uint64_t>(n)));
        } while (std::find(taken, taken + i, j) != taken + i);
        taken[i] = j;
      }
    } else {
      std::unordered_set<int64_t> selected;
      selected.reserve(static_cast<size_t>(k));
      for (int64_t i = 0; i < k; ++i) {
        auto j = static_cast<int64_t>(randbelow(static_cast<uint64_t>(n)));
        while (!selected.insert(j).second)
          j = static_cast<int64_t>(randbelow(static_cast<uint64_t>(n)));
        taken[i] = j;
      }
    }
  }
  return Status::ok_status();
}

}  // namespace sciattn::detail
