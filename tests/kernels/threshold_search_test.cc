// The sampling kernel's threshold search, run on the host with a probe that makes the same pass
// over a row as the kernel's: exact thresholds for counts (top-k, log-probability alternatives)
// and probability mass (top-p), on rows with ties, NaN, infinities, signed zeros and extreme
// ranges, in a bounded number of passes.
#include "kernels/internal/threshold_search.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace hr::kernels::internal {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The row's probe: weight of the values >= t (1 each, or exp((x - mx) / T) summed in id order, as
// a thread would), with the least value at or above t and the greatest below it.
struct RowProbe {
  const std::vector<float>* row;
  bool mass = false;
  float mx = 0.0f, inv_t = 1.0f;
  Probe operator()(float t) const {
    Probe p{0.0f, kInf, -kInf};
    for (float x : *row) {
      if (x >= t) {
        p.weight += mass ? std::exp((x - mx) * inv_t) : 1.0f;
        p.least_at_or_above = std::min(p.least_at_or_above, x);
      } else if (x < t) {
        p.greatest_below = std::max(p.greatest_below, x);
      }
    }
    return p;
  }
};

// The answer by binary search over the row's sorted distinct finite values, with the same probe.
float reference(const std::vector<float>& row, const RowProbe& probe, float need) {
  std::vector<float> v;
  for (float x : row) {
    if (std::isfinite(x)) v.push_back(x);
  }
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());  // -0.0 and +0.0 are one value
  size_t good = 0, bad = v.size();  // v[good] meets need; nothing at or past bad does
  while (bad - good > 1) {
    const size_t mid = (good + bad) / 2;
    if (probe(v[mid]).weight >= need)
      good = mid;
    else
      bad = mid;
  }
  return v[good];
}

struct Outcome {
  float got, want;
  int probes;
};

// Searches `row` for the threshold of `need` from its least finite value, as the kernel does.
Outcome search(const std::vector<float>& row, const RowProbe& probe, float need) {
  float lo = kInf, top = -kInf;
  for (float x : row) {
    if (std::isfinite(x)) {
      lo = std::min(lo, x);
      top = std::max(top, x);
    }
  }
  Outcome o{};
  o.got = highest_threshold(lo, top, need, probe, &o.probes);
  o.want = reference(row, probe, need);
  return o;
}

std::vector<float> normal_row(size_t n, float sigma, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> row(n);
  for (float& x : row) x = d(rng);
  return row;
}

// A language model's row: a long low tail and a few likely tokens well above it.
std::vector<float> peaked_row(size_t n, std::mt19937& rng) {
  std::vector<float> row = normal_row(n, 2.0f, rng);
  for (int i = 0; i < 8; ++i)
    row[rng() % n] = 14.0f - 1.5f * static_cast<float>(i) + 0.01f * static_cast<float>(rng() % 100);
  return row;
}

void expect_exact(const Outcome& o, const char* what) {
  EXPECT_EQ(o.got, o.want) << what;
  EXPECT_LE(o.probes, kValueHalvings + 32) << what;
}

TEST(ThresholdSearchTest, CountThresholdIsTheKthLargestValue) {
  std::mt19937 rng(3);
  const std::vector<float> row = normal_row(128256, 3.0f, rng);
  std::vector<float> sorted = row;
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  const RowProbe count{&row};
  for (int k : {1, 2, 5, 20, 50, 1000, 128255, 128256}) {
    const Outcome o = search(row, count, static_cast<float>(k));
    expect_exact(o, "count");
    EXPECT_EQ(o.got, sorted[static_cast<size_t>(k - 1)]) << k;
    EXPECT_LE(o.probes, 20) << k;  // bisection took forty
  }
}

TEST(ThresholdSearchTest, MassThresholdIsTheSmallestNucleus) {
  std::mt19937 rng(5);
  for (int r = 0; r < 3; ++r) {
    const std::vector<float> row = r == 0 ? normal_row(128256, 3.0f, rng) : peaked_row(128256, rng);
    const float mx = *std::max_element(row.begin(), row.end());
    for (float temperature : {0.6f, 1.0f, 1.5f}) {
      const RowProbe mass{&row, true, mx, 1.0f / temperature};
      const float total = mass(-kInf).weight;
      for (float p : {0.1f, 0.5f, 0.9f, 0.95f, 0.999f}) {
        const Outcome o = search(row, mass, p * total);
        expect_exact(o, "mass");
        // The tokens above the threshold fall short of p; with it they reach p.
        EXPECT_LT(mass(std::nextafter(o.got, kInf)).weight, p * total);
        EXPECT_GE(mass(o.got).weight, p * total);
        EXPECT_LE(o.probes, 24) << "row " << r << " T " << temperature << " p " << p;
      }
    }
  }
}

TEST(ThresholdSearchTest, TiesNanAndInfinitiesTakeNoPart) {
  std::mt19937 rng(11);
  std::vector<float> row(5003);
  for (size_t i = 0; i < row.size(); ++i) {
    const unsigned kind = rng() % 10;
    row[i] = kind == 0   ? NAN
             : kind == 1 ? -kInf
                         : static_cast<float>(rng() % 6);  // six tied values
  }
  const RowProbe count{&row};
  int finite = 0;
  for (float x : row) finite += std::isfinite(x) ? 1 : 0;
  for (int k : {1, 2, 7, 600, 1000, 2000, finite}) {
    const Outcome o = search(row, count, static_cast<float>(k));
    expect_exact(o, "ties");
    EXPECT_LE(o.probes, 6) << k;  // six values: each probe drops at least one
  }
  const RowProbe mass{&row, true, 5.0f, 1.0f};
  const float total = mass(-kInf).weight;
  for (float p : {0.2f, 0.7f, 0.99f}) expect_exact(search(row, mass, p * total), "tied mass");
}

TEST(ThresholdSearchTest, ExtremeRangesEndWithinTheBitBound) {
  std::mt19937 rng(13);
  std::vector<float> row;
  for (int e = -149; e <= 127; e += 3) {
    row.push_back(std::ldexp(1.0f, e));
    row.push_back(-std::ldexp(1.5f, e));
  }
  row.push_back(0.0f);
  row.push_back(-0.0f);
  row.push_back(std::numeric_limits<float>::max());
  row.push_back(std::numeric_limits<float>::lowest());
  row.push_back(std::numeric_limits<float>::denorm_min());
  row.push_back(-std::numeric_limits<float>::denorm_min());
  std::shuffle(row.begin(), row.end(), rng);
  const RowProbe count{&row};
  int past_value_halving = 0;  // searches that went on in bit patterns
  for (int k = 1; k <= static_cast<int>(row.size()); ++k) {
    const Outcome o = search(row, count, static_cast<float>(k));
    expect_exact(o, "range");
    past_value_halving += o.probes > kValueHalvings ? 1 : 0;
  }
  EXPECT_GT(past_value_halving, 0);
  // Only the zeros and the two least denormals: each side of zero one key apart.
  const std::vector<float> zeros = {0.0f, -std::numeric_limits<float>::denorm_min(), -0.0f,
                                    std::numeric_limits<float>::denorm_min(), 0.0f};
  const RowProbe zero_count{&zeros};
  for (int k = 1; k <= 5; ++k)
    expect_exact(search(zeros, zero_count, static_cast<float>(k)), "zeros");
}

TEST(ThresholdSearchTest, SmallRows) {
  std::mt19937 rng(17);
  for (size_t n = 1; n <= 12; ++n) {
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<float> row(n);
      for (float& x : row) x = static_cast<float>(static_cast<int>(rng() % 7) - 3) * 0.5f;
      const RowProbe count{&row};
      for (size_t k = 1; k <= n; ++k)
        expect_exact(search(row, count, static_cast<float>(k)), "small");
    }
  }
}

TEST(ThresholdSearchTest, KeysKeepTheOrderOfFloats) {
  const std::vector<float> ordered = {-kInf, std::numeric_limits<float>::lowest(),
                                      -1.0f, -std::numeric_limits<float>::denorm_min(),
                                      0.0f,  std::numeric_limits<float>::denorm_min(),
                                      1.0f,  std::numeric_limits<float>::max(),
                                      kInf};
  for (size_t i = 0; i + 1 < ordered.size(); ++i) {
    EXPECT_LT(float_key(ordered[i]), float_key(ordered[i + 1])) << i;
    EXPECT_EQ(key_float(float_key(ordered[i])), ordered[i]) << i;
  }
  EXPECT_EQ(float_key(-0.0f) + 1u, float_key(0.0f));
}

}  // namespace
}  // namespace hr::kernels::internal
