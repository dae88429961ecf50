/* Cephes' expf polynomial in 16 lanes, shared by layer_glue.c and attention_rows.c: each
   clamps its input and applies the 2^n its own way. `native_build` hashes this header with
   each source that includes it, so a change here builds both again. */

#ifndef QD_SIMD_EXP_H
#define QD_SIMD_EXP_H

#include <immintrin.h>

/* p and n with exp(x) = p * 2^n, for x the caller has clamped to [-87, 88]: n = round(x *
   log2(e)), r = x - n * ln(2) in two parts, p = 1 + r + r^2 * (polynomial in r). */
__attribute__((target("avx512f"), always_inline)) static inline __m512
qd_exp_parts512(__m512 x, __m512 *n_out) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500E-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073E-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894E-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459E-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201E-1f));
  *n_out = n;
  return _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
}

#endif
