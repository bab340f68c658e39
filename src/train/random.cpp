// xoshiro256** (Blackman and Vigna) seeded through splitmix64. Trainer layer (host code).
#include "sciattn/train/random.h"

#include <cmath>

namespace sciattn::train {
namespace {

uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

uint64_t splitmix64(uint64_t* x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

void Rng::seed_with(uint64_t seed) {
  uint64_t x = seed;
  for (uint64_t& word : s_) word = splitmix64(&x);
}

uint64_t Rng::next_u64() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

uint64_t Rng::below(uint64_t n) {
  // Accept draws below the largest multiple of n; the rest would favour small values.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = next_u64();
  } while (x >= limit);
  return x % n;
}

double Rng::normal() {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  const double u1 = 1.0 - uniform();  // (0, 1]: log is finite
  const double u2 = uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

double normal_at(uint64_t key, uint64_t index) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  uint64_t x1 = key + 2 * index, x2 = key + 2 * index + 1;
  // splitmix64 advances its state by the golden-ratio increment before finalising; starting
  // one increment back makes these the draws of a splitmix64 stream positioned at the counter.
  x1 -= 0x9e3779b97f4a7c15ULL;
  x2 -= 0x9e3779b97f4a7c15ULL;
  const double u1 = 1.0 - static_cast<double>(splitmix64(&x1) >> 11) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(splitmix64(&x2) >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

}  // namespace sciattn::train
