/* The exact int8 linear of `quantize.Int8Linear` for a few rows, with AVX-512 VNNI.

   Built and loaded by `int8_rows.py` (which explains when it is used); compiled for any x86-64
   and called only where the CPU has AVX-512 F, BW and VNNI.

   For each row r of x (float32, M x K) and output channel n:
     sx[r]    = max(max_k |x[r,k]| / 127, FLT_MIN)
     xq[r,k]  = clamp(round_half_even(x[r,k] / sx[r]), -127, 127)
     acc      = sum_k xq[r,k] * w[n,k]                  exact, in int32
     y[r,n]   = ((float)acc * sw[n]) * sx[r]  (+ b[n])  each product rounded once
   which is bitwise what the torch path computes (quantize_rows, the integer matmul, the two
   scalings and the bias, each a separately rounded float32 operation: built with
   -ffp-contract=off so no multiply-add is fused). The sum is exact, so its order is free.

   VNNI multiplies unsigned by signed bytes: xq + 128 is a byte, and the 128 * sum_k w[n,k] it
   adds is taken back (wsum128[n], precomputed). The weights stream once from memory per call
   (NB output channels at a time, all rows against them); at one row that is all the call
   does, which is why it reads memory faster than oneDNN's general kernel. */

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define NB 8      /* output channels per block */
#define MAX_ROWS 8

TARGET static void quantize_row(const float *x, int K, uint8_t *xu, float *scale_out) {
  __m512 amax = _mm512_setzero_ps();
  int k = 0;
  for (; k + 16 <= K; k += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(x + k)));
  float m = _mm512_reduce_max_ps(amax);
  for (; k < K; k++) m = fmaxf(m, fabsf(x[k]));
  float scale = m / 127.0f;
  if (scale < FLT_MIN) scale = FLT_MIN;
  *scale_out = scale;
  __m512 vs = _mm512_set1_ps(scale), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  __m512i shift = _mm512_set1_epi32(128);
  k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 q = _mm512_div_ps(_mm512_loadu_ps(x + k), vs);
    q = _mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm512_min_ps(_mm512_max_ps(q, lo), hi);
    _mm_storeu_si128((__m128i *)(xu + k),
                     _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(q), shift)));
  }
  for (; k < K; k++) {
    float q = nearbyintf(x[k] / scale);
    q = q < -127.0f ? -127.0f : (q > 127.0f ? 127.0f : q);
    xu[k] = (uint8_t)((int)q + 128);
  }
}

TARGET static inline __m512i load_tail(const void *p, __mmask64 mask) {
  return _mm512_maskz_loadu_epi8(mask, p);
}

/* One block of NB output channels (nc of them real) against the M rows: M and NB are constants
   after inlining, so the accumulators stay in registers (M * NB of the 32 zmm). */
TARGET __attribute__((always_inline)) static inline void block(
    const int M, const int nc, const uint8_t *xu, int K64, int full, __mmask64 tail,
    const int8_t *w, int K, int n0, const int32_t *wsum128, const float *sw, const float *bias,
    const float *sx, float *y, int N) {
  __m512i acc[M][NB];
  for (int r = 0; r < M; r++)
    for (int c = 0; c < NB; c++) acc[r][c] = _mm512_setzero_si512();
  const int8_t *w0 = w + (size_t)n0 * K;
  for (int kb = 0; kb < full; kb++) {
    for (int c = 0; c < nc; c++) {
      __m512i wv = _mm512_loadu_si512((const void *)(w0 + (size_t)c * K + (size_t)kb * 64));
      for (int r = 0; r < M; r++) {
        __m512i xv = _mm512_loadu_si512((const void *)(xu + (size_t)r * K64 + (size_t)kb * 64));
        acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], xv, wv);
      }
    }
  }
  if (tail) {
    for (int c = 0; c < nc; c++) {
      __m512i wv = load_tail(w0 + (size_t)c * K + (size_t)full * 64, tail);
      for (int r = 0; r < M; r++) {
        __m512i xv = _mm512_loadu_si512((const void *)(xu + (size_t)r * K64 + (size_t)full * 64));
        acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], xv, wv);
      }
    }
  }
  for (int r = 0; r < M; r++) {
    for (int c = 0; c < nc; c++) {
      const int n = n0 + c;
      const int32_t sum = _mm512_reduce_add_epi32(acc[r][c]) - wsum128[n];
      float v = ((float)sum * sw[n]) * sx[r];
      if (bias) v = v + bias[n];
      y[(size_t)r * N + n] = v;
    }
  }
}

#define ROWS_CASE(m)                                                                         \
  case m:                                                                                    \
    if (nc == NB)                                                                            \
      block(m, NB, xu, K64, full, tail, w, K, n0, wsum128, sw, bias, sx, y, N);              \
    else                                                                                     \
      block(m, nc, xu, K64, full, tail, w, K, n0, wsum128, sw, bias, sx, y, N);              \
    break;

/* y[M, N] from x[M, K]; w int8 [N, K] row-major; xu a scratch of M * K64 bytes (K64: K
   rounded up to 64; its tail is zeroed here). */
TARGET void qd_int8_rows(const float *x, int M, int K, const int8_t *w, int N,
                         const int32_t *wsum128, const float *sw, const float *bias, float *y,
                         uint8_t *xu, int threads) {
  if (M < 1 || M > MAX_ROWS) return;
  const int K64 = (K + 63) & ~63;
  float sx[MAX_ROWS];
  for (int r = 0; r < M; r++) {
    memset(xu + (size_t)r * K64 + K, 0, K64 - K);
    quantize_row(x + (size_t)r * K, K, xu + (size_t)r * K64, &sx[r]);
  }
  const int blocks = (N + NB - 1) / NB;
  const int full = K / 64;
  const __mmask64 tail = (K % 64) ? (~0ULL >> (64 - K % 64)) : 0;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int b = 0; b < blocks; b++) {
    const int n0 = b * NB, nc = N - n0 < NB ? N - n0 : NB;
    switch (M) {
      ROWS_CASE(1)
      ROWS_CASE(2)
      ROWS_CASE(3)
      ROWS_CASE(4)
      default:
        /* 5 to 8 rows: two passes over the block, from cache the second time. */
        for (int r0 = 0; r0 < M; r0 += 4) {
          const int m = M - r0 < 4 ? M - r0 : 4;
          const uint8_t *xr = xu + (size_t)r0 * K64;
          float *yr = y + (size_t)r0 * N;
          if (m == 4) block(4, nc, xr, K64, full, tail, w, K, n0, wsum128, sw, bias, sx + r0, yr, N);
          else if (m == 3) block(3, nc, xr, K64, full, tail, w, K, n0, wsum128, sw, bias, sx + r0, yr, N);
          else if (m == 2) block(2, nc, xr, K64, full, tail, w, K, n0, wsum128, sw, bias, sx + r0, yr, N);
          else block(1, nc, xr, K64, full, tail, w, K, n0, wsum128, sw, bias, sx + r0, yr, N);
        }
    }
  }
}
