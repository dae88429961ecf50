/* The exact int8 linear of `quantize.Int8Linear` for a few rows, with AVX-512 VNNI.

   Built and loaded by `int8_rows.py` (which explains when it is used); compiled for any x86-64
   and called only where the CPU has AVX-512 F, BW and VNNI.

   For each row r of x (float32, M x K) and output channel n:
     sx[r]    = max(max_k |x[r,k]| / 127, FLT_MIN)
     xq[r,k]  = clamp(round_half_even(x[r,k] / sx[r]), -127, 127)
     acc      = sum_k xq[r,k] * w[n,k]                  exact, in int32
     y[r,n]   = ((float)acc * sw[n]) * sx[r]  (+ b[n])  each operation rounded once
   which is bitwise what the torch path computes (quantize_rows, the integer matmul, the two
   scalings and the bias, each a separately rounded float32 operation: built with
   -ffp-contract=off so no multiply-add is fused). The sum is exact, so its order is free.

   The weights are held as bytes w + 128 in blocks of 16 output channels, four inputs at a
   time: wb[((n / 16) * (K / 4) + k / 4) * 64 + (n % 16) * 4 + k % 4]. One 64-byte load then
   holds 16 channels x 4 inputs, and VNNI multiplies it (unsigned) by one row's 4 quantized
   inputs broadcast (signed), adding into 16 channel sums at once: no horizontal sums. The 128
   added to each weight adds 128 * sum_k xq[r,k] to every sum of row r, taken back. Each call
   streams the weights once (4 channel blocks at a time per thread, every row against them),
   which is all that one to four rows need: it reads memory at the machine's speed, where
   oneDNN's general kernel read it at two thirds of it. */

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define MAX_ROWS 4
#define GROUP 4 /* channel blocks of 16 per pass */

/* Row x[0..K) quantized to signed bytes xq; its scale, and 128 * the sum of xq. */
TARGET static void quantize_row(const float *x, int K, int8_t *xq, float *scale_out,
                                int32_t *sum128_out) {
  __m512 amax = _mm512_setzero_ps();
  int k = 0;
  for (; k + 16 <= K; k += 16) amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(x + k)));
  float m = _mm512_reduce_max_ps(amax);
  for (; k < K; k++) m = fmaxf(m, fabsf(x[k]));
  float scale = m / 127.0f;
  if (scale < FLT_MIN) scale = FLT_MIN;
  __m512 vs = _mm512_set1_ps(scale), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
  __m512i sum = _mm512_setzero_si512();
  int32_t tail_sum = 0;
  k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 q = _mm512_div_ps(_mm512_loadu_ps(x + k), vs);
    q = _mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm512_min_ps(_mm512_max_ps(q, lo), hi);
    __m512i qi = _mm512_cvtps_epi32(q);
    sum = _mm512_add_epi32(sum, qi);
    _mm_storeu_si128((__m128i *)(xq + k), _mm512_cvtepi32_epi8(qi));
  }
  for (; k < K; k++) {
    float q = nearbyintf(x[k] / scale);
    q = q < -127.0f ? -127.0f : (q > 127.0f ? 127.0f : q);
    xq[k] = (int8_t)q;
    tail_sum += (int32_t)q;
  }
  *scale_out = scale;
  *sum128_out = 128 * (_mm512_reduce_add_epi32(sum) + tail_sum);
}

/* Rows 0..M) against channel blocks b0..b0+CB); M and CB are constants after inlining, so the
   M * CB accumulators stay in registers. */
TARGET __attribute__((always_inline)) static inline void blocks(
    const int M, const int CB, const uint8_t *wb, int K4, int b0, const int8_t *xq, int K,
    const int32_t *sum128, const float *sx, const float *sw, const float *bias, float *y, int N) {
  __m512i acc[M][CB];
  for (int r = 0; r < M; r++)
    for (int c = 0; c < CB; c++) acc[r][c] = _mm512_setzero_si512();
  for (int k4 = 0; k4 < K4; k4++) {
    __m512i w[CB];
    for (int c = 0; c < CB; c++)
      w[c] = _mm512_loadu_si512((const void *)(wb + ((size_t)(b0 + c) * K4 + k4) * 64));
    for (int r = 0; r < M; r++) {
      int32_t four; /* the row's 4 bytes at k4, read without breaking C's aliasing rules */
      memcpy(&four, xq + (size_t)r * K + k4 * 4, sizeof four);
      const __m512i x4 = _mm512_set1_epi32(four);
      for (int c = 0; c < CB; c++) acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], w[c], x4);
    }
  }
  for (int r = 0; r < M; r++) {
    const __m512 row_scale = _mm512_set1_ps(sx[r]);
    const __m512i correction = _mm512_set1_epi32(sum128[r]);
    for (int c = 0; c < CB; c++) {
      const int n = (b0 + c) * 16;
      const __m512 sums = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][c], correction));
      __m512 v = _mm512_mul_ps(_mm512_mul_ps(sums, _mm512_loadu_ps(sw + n)), row_scale);
      if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + n));
      _mm512_storeu_ps(y + (size_t)r * N + n, v);
    }
  }
}

#define GROUP_OF(m)                                                                          \
  case m:                                                                                    \
    switch (count) {                                                                         \
      case 4: blocks(m, 4, wb, K4, b0, xq, K, sum128, sx, sw, bias, y, N); break;            \
      case 3: blocks(m, 3, wb, K4, b0, xq, K, sum128, sx, sw, bias, y, N); break;            \
      case 2: blocks(m, 2, wb, K4, b0, xq, K, sum128, sx, sw, bias, y, N); break;            \
      default: blocks(m, 1, wb, K4, b0, xq, K, sum128, sx, sw, bias, y, N); break;           \
    }                                                                                        \
    break;

/* y[M, N] (float32) from x[M, K] (float32); wb the blocked weights (above); N % 16 == 0,
   K % 4 == 0, 1 <= M <= MAX_ROWS; xq a scratch of M * K bytes. Returns 0, or -1 for shapes
   it does not take (nothing written then). */
TARGET int qd_int8_rows(const float *x, int M, int K, const uint8_t *wb, int N, const float *sw,
                        const float *bias, float *y, int8_t *xq, int threads) {
  if (M < 1 || M > MAX_ROWS || N % 16 || K % 4 || K < 4) return -1;
  float sx[MAX_ROWS];
  int32_t sum128[MAX_ROWS];
  for (int r = 0; r < M; r++)
    quantize_row(x + (size_t)r * K, K, xq + (size_t)r * K, &sx[r], &sum128[r]);
  const int K4 = K / 4, NB = N / 16, groups = (NB + GROUP - 1) / GROUP;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int g = 0; g < groups; g++) {
    const int b0 = g * GROUP, count = NB - b0 < GROUP ? NB - b0 : GROUP;
    switch (M) {
      GROUP_OF(1)
      GROUP_OF(2)
      GROUP_OF(3)
      GROUP_OF(4)
    }
  }
  return 0;
}
