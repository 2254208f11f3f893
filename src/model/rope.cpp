#include "model/rope.h"

#include <cmath>
#include <numbers>

#include "core/device.h"

namespace mt::model {

std::vector<double> rope_inv_freq(const GptConfig& c) {
  const int64_t hd = c.head_dim(), half = hd / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    f[static_cast<size_t>(i)] =
        1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(hd));
  const RopeScaling& s = c.rope_scaling;
  if (!s.llama3) return f;
  const double old_len = static_cast<double>(s.original_max_position);
  const double low_wavelen = old_len / s.low_freq_factor;
  const double high_wavelen = old_len / s.high_freq_factor;
  for (double& x : f) {
    const double wavelen = 2.0 * std::numbers::pi / x;
    if (wavelen > low_wavelen) {
      x /= s.factor;                       // long wavelengths: interpolated
    } else if (wavelen >= high_wavelen) {  // between: a smooth blend
      const double smooth =
          (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      x = (1.0 - smooth) * x / s.factor + smooth * x;
    }  // short wavelengths: kept
  }
  return f;
}

RopeTables make_rope_tables(const GptConfig& c, const std::vector<int32_t>& positions) {
  const std::vector<double> f = rope_inv_freq(c);
  const int64_t half = static_cast<int64_t>(f.size()), T = static_cast<int64_t>(positions.size());
  std::vector<float> cs(static_cast<size_t>(T * half)), sn(cs.size());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double a =
          static_cast<double>(positions[static_cast<size_t>(t)]) * f[static_cast<size_t>(i)];
      cs[static_cast<size_t>(t * half + i)] = static_cast<float>(std::cos(a));
      sn[static_cast<size_t>(t * half + i)] = static_cast<float>(std::sin(a));
    }
  auto put = [&](const std::vector<float>& host) {
    Tensor t = Tensor::empty({T, half}, DType::kF32, mem::Category::kWorkspace);
    device::copy(t.raw(), t.device(), host.data(), mem::Device::kCpu, t.bytes());
    return t;
  };
  return {put(cs), put(sn)};
}

RopeTables make_rope_tables(const GptConfig& c, int64_t T) {
  std::vector<int32_t> positions(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) positions[static_cast<size_t>(t)] = static_cast<int32_t>(t);
  return make_rope_tables(c, positions);
}

}  // namespace mt::model
