// The DiLoCo tests' reference: the outer Nesterov step of two sites on one element, in
// double, against which the trainer's f32 outer step is checked (docs/diloco.md).
#pragma once

#include <cmath>

namespace mt::test {

struct OuterStep {
  double want;  // the outer parameter after the step
  double tol;   // the f32 code's rounding bound
};

// `before`: the outer parameter; site0, site1: the two sites' values (what they sent);
// m: the element's momentum, updated in place. The mean pseudo-gradient
// ((before - site0) + (before - site1)) / 2, m = mu·m + mean, want = before - lr·(mean + mu·m).
// The code's f32 arithmetic rounds at most 8 times per element and round (two differences, a
// sum, a division, the momentum's product and sum, the update's), each 2^-24 of the
// magnitudes involved, plus the momentum's from the rounds before: 2^-20 (16 roundings) of
// their sum covers three rounds.
inline OuterStep nesterov_two_sites(double before, double site0, double site1, double& m, double lr,
                                    double mu) {
  const double mean = ((before - site0) + (before - site1)) / 2;
  const double m_prev = m;
  m = mu * m + mean;
  const double want = before - lr * (mean + mu * m);
  const double tol = std::ldexp(
      std::fabs(before) + std::fabs(site0) + std::fabs(site1) + std::fabs(m_prev) + std::fabs(want),
      -20);
  return {want, tol};
}

}  // namespace mt::test
