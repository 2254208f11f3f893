// The GEMM peak of this host, the denominator of MFU: the best f32 / bf16 GEMM rate
// measured at a thread count, cached in $XDG_CACHE_HOME/meshtrain/peak.json (or
// ~/.cache/meshtrain/peak.json) so that it is measured once per CPU and thread count (a
// cache recorded on another CPU, as when $HOME outlives the machine under it, is ignored).
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"

namespace mt::kernels {

// FLOP/s of the best GEMM of `dtype` on `threads` threads: the cached value, or measured
// (about a second) and cached when missing. Thread-safe.
double peak_flops(DType dtype, int threads);

// Measures now (ignores and does not touch the cache).
double measure_peak_flops(DType dtype, int threads);

// Records a measured value in the cache file (and the in-process cache), keeping the
// larger of it and what was cached (a peak is the best rate seen); returns the value kept.
// To forget a value, delete the file.
double store_peak_flops(DType dtype, int threads, double flops);

// The calling thread's GPU's GEMM peak (M = N = K = 8192, median of timed runs), measured
// once per process, GPU and dtype: the MFU denominator with --device cuda.
double gpu_peak_flops(DType dtype);

// The CPU a cached peak belongs to (model, family, model number, stepping, a hash of the
// feature flags, the CPU count), recorded in the cache file as "cpu".
std::string cpu_identity();

// Where the cache lives.
std::string peak_cache_path();

// FLOP/s (2*M*N*K / time) of one GEMM shape: C[M,N] = op(A) op(B), best of `reps` timed
// runs after one warm-up, on the calling thread's current thread count.
double time_gemm_flops(DType dtype, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                       int reps, double* best_time_s = nullptr);

}  // namespace mt::kernels
