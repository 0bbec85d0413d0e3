// Seeded gradient-like test data for the cross-process tests: heavy-tailed magnitudes
// (normal times lognormal, scaled 1e-3) with a quarter exact zeros, like real gradients.
#ifndef GCOMP_TESTS_SYNTHETIC_GRADIENT_H_
#define GCOMP_TESTS_SYNTHETIC_GRADIENT_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace gcomp::testing {

inline std::vector<float> SyntheticGradient(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = normal(rng) * std::exp(normal(rng) * 2.0f) * 1e-3f;
    if (rng() % 4 == 0) g[i] = 0.0f;
  }
  return g;
}

}  // namespace gcomp::testing

#endif  // GCOMP_TESTS_SYNTHETIC_GRADIENT_H_
