// Tests of PythonRandom against CPython's `random` (spec 1.8). Test layer (label cpu).
//
// The expected arrays below were produced once by CPython 3.11.7 with this script (run it again
// to regenerate them; no Python is needed to run the tests):
//
//   import random
//   for s in [0, 1, 42, 2**32 - 1, 2**32, 2**64 - 1, -7, 7]:
//       random.seed(s)
//       o = [random.getrandbits(32) for _ in range(1001)]
//       print(s, [o[i] for i in (0, 1, 2, 3, 623, 624, 1000)])
//   random.seed(0x123 | (0x234 << 32) | (0x345 << 64) | (0x456 << 96))
//   print([random.getrandbits(32) for _ in range(5)])
//   random.seed(99)
//   print([random.getrandbits(k) for k in (1, 5, 17, 31, 32, 33, 48, 64)])
//   random.seed(12345)
//   ns = [1, 2, 3, 5, 7, 100, 2**31, 2**32 - 1, 2**32, 2**40 + 5, 2**64 - 1]
//   print([random.randrange(n) for n in ns * 2])     # randrange(n) is _randbelow(n)
//   random.seed(2024)
//   for n, k in [(8, 1), (10, 3), (21, 5), (22, 5), (30, 6), (85, 6), (86, 6), (100, 6),
//                (1000, 50), (10, 10), (64, 2), (1, 1), (5, 0), (0, 0)]:
//       print(n, k, random.sample(range(n), k))
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "common/python_random.h"

namespace sciattn::detail {
namespace {

// The test vector of spec 1.8: seed(0), then eight sample(range(8), 1).
TEST(PythonRandom, SpecTestVector) {
  PythonRandom rng(0);
  const std::vector<int64_t> expected = {6, 6, 0, 4, 7, 6, 4, 7};
  std::vector<int64_t> got;
  for (int i = 0; i < 8; ++i) {
    std::vector<int64_t> one;
    ASSERT_TRUE(rng.sample_range(8, 1, &one).ok());
    ASSERT_EQ(one.size(), 1u);
    got.push_back(one[0]);
  }
  EXPECT_EQ(got, expected);
}

// Raw outputs, including the first words after the second state regeneration (index 624) and
// seeds of one and two 32-bit words.
TEST(PythonRandom, SeedAndRawOutputsMatchCPython) {
  struct Case {
    uint64_t seed;
    std::vector<uint32_t> at_0_1_2_3_623_624_1000;
  };
  const Case cases[] = {
      {0,
       {3626764237u, 1654615998u, 3255389356u, 3823568514u, 2390040247u, 2229104038u, 126175447u}},
      {1,
       {577090037u, 2444712010u, 3639700191u, 3445702192u, 802355090u, 1360367077u, 2160508093u}},
      {42,
       {2746317213u, 478163327u, 107420369u, 3184935163u, 2929454134u, 1071722055u, 2672573305u}},
      {4294967295u,
       {2728839433u, 2661025012u, 872737089u, 924893097u, 2365591444u, 2143983266u, 2478953446u}},
      {4294967296u,
       {485306839u, 1508871100u, 1794561286u, 4014597330u, 1921684606u, 2208258976u, 1608289731u}},
      {18446744073709551615u,
       {93740670u, 1068495656u, 1452108352u, 2657516307u, 2799746052u, 3597309115u, 888869258u}},
      // random.seed(-7) and random.seed(7) give the same stream: CPython seeds with |s|.
      {7, {1390851128u, 4071050724u, 647892279u, 1695753998u, 960836459u, 693491440u, 3192093819u}},
  };
  const int positions[] = {0, 1, 2, 3, 623, 624, 1000};
  for (const Case& c : cases) {
    PythonRandom rng(c.seed);
    std::vector<uint32_t> outputs;
    for (int i = 0; i <= 1000; ++i) outputs.push_back(rng.next_uint32());
    for (size_t p = 0; p < 7; ++p) {
      EXPECT_EQ(outputs[positions[p]], c.at_0_1_2_3_623_624_1000[p])
          << "seed " << c.seed << " output " << positions[p];
    }
  }
}

// The reference MT19937 check (mt19937ar.c keys with {0x123, 0x234, 0x345, 0x456}), which is
// random.seed of the integer with those 32-bit words.
TEST(PythonRandom, MultiWordSeedMatchesReferenceMt19937) {
  PythonRandom rng;
  rng.seed_words({0x123u, 0x234u, 0x345u, 0x456u});
  const uint32_t expected[] = {1067595299u, 955945823u, 477289528u, 4107218783u, 4228976476u};
  for (uint32_t e : expected) EXPECT_EQ(rng.next_uint32(), e);
}

TEST(PythonRandom, ZeroSeedIsTheEmptyKey) {
  PythonRandom a(0);
  PythonRandom b;
  b.seed_words({});
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next_uint32(), b.next_uint32());
}

TEST(PythonRandom, ReseedingRestartsTheStream) {
  PythonRandom rng(5);
  const uint32_t first = rng.next_uint32();
  rng.next_uint32();
  rng.seed_uint(5);
  EXPECT_EQ(rng.next_uint32(), first);
}

TEST(PythonRandom, GetrandbitsMatchesCPython) {
  PythonRandom rng(99);
  const int ks[] = {1, 5, 17, 31, 32, 33, 48, 64};
  const uint64_t expected[] = {0u,         12u,        26224u,           1287285677u,
                               767950141u, 988970880u, 213885648653824u, 4632918339950871006u};
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(rng.getrandbits(ks[i]), expected[i]) << "k=" << ks[i];
}

TEST(PythonRandom, RandbelowMatchesCPython) {
  PythonRandom rng(12345);
  const uint64_t ns[] = {1u,
                         2u,
                         3u,
                         5u,
                         7u,
                         100u,
                         2147483648u,
                         4294967295u,
                         4294967296u,
                         1099511627781u,
                         18446744073709551615u};
  const uint64_t expected[] = {0u,
                               0u,
                               1u,
                               2u,
                               1u,
                               34u,
                               1873586768u,
                               694443915u,
                               1602297017u,
                               952942322609u,
                               10368517950970186588u,
                               0u,
                               0u,
                               1u,
                               0u,
                               4u,
                               94u,
                               1770039327u,
                               2512780184u,
                               2164385946u,
                               451607849029u,
                               1435931999638272781u};
  for (size_t i = 0; i < 22; ++i) {
    EXPECT_EQ(rng.randbelow(ns[i % 11]), expected[i]) << "call " << i << " n=" << ns[i % 11];
  }
}

// One stream of samples that crosses CPython's pool/set switch (setsize 21 for k <= 5, 85 for
// k = 6), the full permutation and the empty samples.
TEST(PythonRandom, SampleMatchesCPython) {
  struct Case {
    int64_t n, k;
    std::vector<int64_t> expected;
  };
  const std::vector<Case> cases = {
      {8, 1, {7}},
      {10, 3, {2, 4, 3}},
      {21, 5, {13, 8, 17, 7, 15}},
      {22, 5, {11, 13, 16, 19, 6}},
      {30, 6, {9, 17, 22, 10, 16, 2}},
      {85, 6, {26, 59, 18, 68, 27, 52}},
      {86, 6, {7, 44, 80, 53, 59, 15}},
      {100, 6, {92, 95, 17, 97, 41, 49}},
      {1000, 50, {338, 353, 812, 205, 333, 437, 424, 324, 581, 219, 926, 888, 416,
                  234, 209, 41,  767, 230, 780, 19,  994, 886, 265, 864, 517, 326,
                  790, 983, 583, 823, 722, 431, 628, 114, 339, 871, 668, 621, 799,
                  236, 241, 475, 374, 139, 207, 377, 505, 609, 856, 643}},
      {10, 10, {2, 4, 6, 8, 9, 5, 3, 0, 7, 1}},
      {64, 2, {26, 8}},
      {1, 1, {0}},
      {5, 0, {}},
      {0, 0, {}},
  };
  PythonRandom rng(2024);
  for (const Case& c : cases) {
    std::vector<int64_t> got;
    ASSERT_TRUE(rng.sample_range(c.n, c.k, &got).ok());
    EXPECT_EQ(got, c.expected) << "sample(range(" << c.n << "), " << c.k << ")";
  }
}

TEST(PythonRandom, SampleSetsizeBoundaries) {
  EXPECT_EQ(python_sample_setsize(0), 21);
  EXPECT_EQ(python_sample_setsize(5), 21);
  EXPECT_EQ(python_sample_setsize(6), 21 + 64);    // ceil(log4(18)) = 3
  EXPECT_EQ(python_sample_setsize(21), 21 + 64);   // ceil(log4(63)) = 3
  EXPECT_EQ(python_sample_setsize(22), 21 + 256);  // ceil(log4(66)) = 4
  EXPECT_EQ(python_sample_setsize(int64_t{1} << 62), INT64_MAX);
}

TEST(PythonRandom, SampleRejectsLikeCPython) {
  PythonRandom rng(0);
  std::vector<int64_t> out;
  Status s = rng.sample_range(3, 4, &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("Sample larger than population"), std::string::npos) << s.message();
  EXPECT_EQ(rng.sample_range(3, -1, &out).code(), StatusCode::kInvalidArgument);
  // A failed sample draws nothing: the stream continues as if it had not been called.
  PythonRandom fresh(0);
  EXPECT_EQ(rng.next_uint32(), fresh.next_uint32());
}

TEST(PythonRandom, SampleIsDistinctAndInRange) {
  PythonRandom rng(31337);
  for (int64_t n : {1, 7, 21, 22, 90, 500}) {
    for (int64_t k : {int64_t{0}, int64_t{1}, n / 2, n}) {
      std::vector<int64_t> got;
      ASSERT_TRUE(rng.sample_range(n, k, &got).ok());
      ASSERT_EQ(static_cast<int64_t>(got.size()), k);
      std::vector<bool> seen(static_cast<size_t>(n), false);
      for (int64_t x : got) {
        ASSERT_GE(x, 0);
        ASSERT_LT(x, n);
        EXPECT_FALSE(seen[static_cast<size_t>(x)]) << "repeat " << x;
        seen[static_cast<size_t>(x)] = true;
      }
    }
  }
}

}  // namespace
}  // namespace sciattn::detail
