/* The small per-row work between a decoder layer's matmuls, in one call each: the residual add
   with the RMSNorm after it, the rotary embedding of the queries and keys, SiLU(gate) * up.

   Built and loaded by `layer_glue.py` (which says when it is used); compiled for any x86-64
   and called only where the CPU has AVX-512 F.

   Each row is computed alone, in a fixed order, from its own inputs (and its position's cos
   and sin), so a row's result never depends on the other rows of a call or on how many there
   are: a forward stays batch-invariant with these as with torch's. The results differ from
   torch's in the last bits (another order of the sum of squares, another exp), so a process
   computes every forward of a model with one or the other (`decoder_loop`). */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#include "simd_exp.h"

#define TARGET __attribute__((target("avx512f")))
#define PARALLEL_ROWS 16 /* rows (a prefill chunk's) from which a call uses the threads */

/* x[r] += delta[r] (when delta is not NULL), then out[r] = w * (x[r] * 1 / sqrt(mean(x[r]^2) +
   eps)), for rows of `dim` floats (a multiple of 16). The sum of squares runs in 16 lanes over
   the row in order, then the lanes are added in a fixed order. */
TARGET int qd_add_rms_norm(float *x, const float *delta, const float *w, float eps, int rows,
                           int dim, float *out, int threads) {
  if (dim % 16 || dim <= 0 || rows < 0) return -1;
#pragma omp parallel for schedule(static) num_threads(threads) if (rows >= PARALLEL_ROWS)
  for (int r = 0; r < rows; r++) {
    float *xr = x + (long)r * dim;
    const float *dr = delta ? delta + (long)r * dim : 0;
    float *o = out + (long)r * dim;
    __m512 acc = _mm512_setzero_ps();
    for (int i = 0; i < dim; i += 16) {
      __m512 v = _mm512_loadu_ps(xr + i);
      if (dr) {
        v = _mm512_add_ps(v, _mm512_loadu_ps(dr + i));
        _mm512_storeu_ps(xr + i, v);
      }
      acc = _mm512_add_ps(acc, _mm512_mul_ps(v, v));
    }
    float lanes[16];
    _mm512_storeu_ps(lanes, acc);
    float sum = 0.0f;
    for (int l = 0; l < 16; l++) sum += lanes[l];
    const float inv = 1.0f / sqrtf(sum / (float)dim + eps);
    const __m512 iv = _mm512_set1_ps(inv);
    for (int i = 0; i < dim; i += 16)
      _mm512_storeu_ps(o + i, _mm512_mul_ps(_mm512_loadu_ps(w + i),
                                            _mm512_mul_ps(_mm512_loadu_ps(xr + i), iv)));
  }
  return 0;
}

/* The rotary embedding, in place, of `heads` heads of `dim` floats (dim / 2 a multiple of 16)
   in each of `rows` rows `row_stride` floats apart: with the halves a and b of a head and
   cos, sin the row's [dim] (their halves equal, as transformers' rotary makes them),
   a' = a * cos - b * sin, b' = b * cos + a * sin (transformers' q * cos + rotate_half(q) * sin). */
TARGET int qd_rotary(float *x, int rows, int heads, int dim, long row_stride, const float *cos,
                     const float *sin, int threads) {
  const int half = dim / 2;
  if (half % 16 || half <= 0 || rows < 0) return -1;
#pragma omp parallel for schedule(static) num_threads(threads) if (rows >= PARALLEL_ROWS)
  for (int r = 0; r < rows; r++) {
    const float *c = cos + (long)r * dim, *s = sin + (long)r * dim;
    for (int h = 0; h < heads; h++) {
      float *a = x + (long)r * row_stride + (long)h * dim, *b = a + half;
      for (int i = 0; i < half; i += 16) {
        const __m512 va = _mm512_loadu_ps(a + i), vb = _mm512_loadu_ps(b + i);
        const __m512 ca = _mm512_loadu_ps(c + i), sa = _mm512_loadu_ps(s + i);
        const __m512 cb = _mm512_loadu_ps(c + half + i), sb = _mm512_loadu_ps(s + half + i);
        _mm512_storeu_ps(a + i, _mm512_sub_ps(_mm512_mul_ps(va, ca), _mm512_mul_ps(vb, sa)));
        _mm512_storeu_ps(b + i, _mm512_add_ps(_mm512_mul_ps(vb, cb), _mm512_mul_ps(va, sb)));
      }
    }
  }
  return 0;
}

/* exp(x) for x in [-87, 88] (clamped there): Cephes' expf polynomial, 2^n by scalef. */
TARGET static inline __m512 exp512(__m512 x) {
  __m512 n;
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 p = qd_exp_parts512(x, &n);
  return _mm512_scalef_ps(p, n);
}

/* out[r][i] = g / (1 + exp(-g)) * u for g = gate_up[r][i], u = gate_up[r][width + i]: the
   gate and up projections side by side in rows of 2 * width floats (width a multiple of 16). */
TARGET int qd_silu_mul(const float *gate_up, int rows, int width, float *out, int threads) {
  if (width % 16 || width <= 0 || rows < 0) return -1;
  const __m512 one = _mm512_set1_ps(1.0f);
#pragma omp parallel for schedule(static) num_threads(threads) if (rows >= PARALLEL_ROWS)
  for (int r = 0; r < rows; r++) {
    const float *g = gate_up + (long)r * 2 * width, *u = g + width;
    float *o = out + (long)r * width;
    for (int i = 0; i < width; i += 16) {
      const __m512 vg = _mm512_loadu_ps(g + i);
      const __m512 e = exp512(_mm512_sub_ps(_mm512_setzero_ps(), vg));
      const __m512 silu = _mm512_div_ps(vg, _mm512_add_ps(one, e));
      _mm512_storeu_ps(o + i, _mm512_mul_ps(silu, _mm512_loadu_ps(u + i)));
    }
  }
  return 0;
}
