// The trainer's random numbers: xoshiro256** seeded through splitmix64, with its own uniform and
// normal transforms, so that initialisation, data shuffling and generated data are the same on
// every platform and compiler. Public API of the trainer (plain C++17).
#pragma once

#include <array>
#include <cstdint>

namespace sciattn::train {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) { seed_with(seed); }
  void seed_with(uint64_t seed);

  uint64_t next_u64();
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n), n >= 1, without modulo bias (rejection).
  uint64_t below(uint64_t n);
  // Standard normal (Box-Muller from two uniforms; one value per call, nothing cached).
  double normal();

  using State = std::array<uint64_t, 4>;
  const State& state() const { return s_; }
  void set_state(const State& s) { s_ = s; }

 private:
  State s_{};
};

// A counter-based draw: element `index` of stream `key`, a function of those two numbers only
// (splitmix64's finaliser on key + 2 index and key + 2 index + 1 gives two uniforms for
// Box-Muller), so that large arrays are filled in parallel with the same values on any thread
// count (the GPT's initialisation: 1.3B draws in a few seconds instead of a minute).
double normal_at(uint64_t key, uint64_t index);

}  // namespace sciattn::train
