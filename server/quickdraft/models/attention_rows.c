/* Attention of a decode step's, a verify forward's or a tree forward's rows, one call per
   layer: what `quantize.rowwise_attention` computed with one SDPA call per row.

   Built and loaded by `attention_rows.py` (which explains when it is used); compiled for any
   x86-64 and called only where the CPU has AVX-512 F, BW and DQ.

   A query vector (one row's one head) is a lane: 16 of them share a vector register, and up
   to 64 of one key/value head make a unit of work, computed whole by one thread. Each lane
   computes, as a scalar would, in a fixed order:
     s_j  = (sum over d, in order, of q[d] * k_j[d], fused multiply-adds) * scale
            for every key j of its row (the cached prefix [0, prefix), then the positions
            `extra` lists: a tree row's path, ascending),
     m    = the largest s_j;  e_j = exp(s_j - m);  sum = e_1 + e_2 + ... in key order,
     out  = (sum over j, in key order, of e_j * v_j, fused) * (1 / sum).
   Lanes never mix, so nothing a lane computes depends on the other rows of the call, on how
   many there are, on which lane or thread it lands in: a row comes out bitwise the same in a
   one-token step and in any verify or tree forward (where a tree row's keys are its path's,
   in order, as the step at its end has them). Keys are read once per unit for all its lanes,
   and values in blocks of KEY_BLOCK that stay in L1 while every lane adds them in, where one
   SDPA call per row read the whole cache once per row: the 1.5B's 28 layers over 1,500 cached
   tokens on 2 AMX cores, 16 rows, took 45 ms that way and 15 this way (1 row: 2.9 and 3.1).
   The results differ from SDPA's in the last bits (another exp, another order of sums); a
   process uses one of the two for all its decode rows. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd_exp.h"

#define TARGET __attribute__((target("avx512f,avx512bw,avx512dq")))
#define INLINE __attribute__((always_inline)) static inline
#define LANES 64     /* query vectors (row x head) a unit takes: 4 registers of 16 */
#define KEY_BLOCK 32 /* keys whose values a pass of the value sums reads from L1 */
#define MAX_C 16     /* 16-float chunks of a head: head dimensions up to 256 */

/* exp(x) for x <= 0 (scores less their maximum): Cephes' expf polynomial, 2^n by scalef;
   exactly 0 below -87 (where float32's exp underflows anyway). */
TARGET INLINE __m512 exp512(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.0f);
  const __mmask16 tiny = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
  __m512 n;
  const __m512 p = qd_exp_parts512(_mm512_max_ps(x, lo), &n);
  return _mm512_maskz_scalef_ps(~tiny, p, n);
}

/* Scores S[j][lane] = (sum_d QT[d][lane] * K[j][d]) * scale for keys j0..j0+JB, G lane groups. */
TARGET INLINE void scores(const int G, const int JB, const float *QT, int D, const float *K,
                          long kv_sr, int j0, float scale, float *S) {
  __m512 acc[4][4];
  for (int b = 0; b < JB; b++)
    for (int g = 0; g < G; g++) acc[b][g] = _mm512_setzero_ps();
  const float *k = K + (long)j0 * kv_sr;
  for (int d = 0; d < D; d++) {
    __m512 qt[4];
    for (int g = 0; g < G; g++) qt[g] = _mm512_loadu_ps(QT + d * LANES + g * 16);
    for (int b = 0; b < JB; b++) {
      const __m512 kd = _mm512_set1_ps(k[b * kv_sr + d]);
      for (int g = 0; g < G; g++) acc[b][g] = _mm512_fmadd_ps(qt[g], kd, acc[b][g]);
    }
  }
  const __m512 sv = _mm512_set1_ps(scale);
  for (int b = 0; b < JB; b++)
    for (int g = 0; g < G; g++)
      _mm512_storeu_ps(S + (long)(j0 + b) * LANES + g * 16, _mm512_mul_ps(acc[b][g], sv));
}

TARGET static void all_scores(int G, const float *QT, int D, const float *K, long kv_sr, int span,
                              float scale, float *S) {
  int j = 0;
  for (; j + 4 <= span; j += 4) switch (G) {
      case 1: scores(1, 4, QT, D, K, kv_sr, j, scale, S); break;
      case 2: scores(2, 4, QT, D, K, kv_sr, j, scale, S); break;
      case 3: scores(3, 4, QT, D, K, kv_sr, j, scale, S); break;
      default: scores(4, 4, QT, D, K, kv_sr, j, scale, S); break;
    }
  for (; j < span; j++) switch (G) {
      case 1: scores(1, 1, QT, D, K, kv_sr, j, scale, S); break;
      case 2: scores(2, 1, QT, D, K, kv_sr, j, scale, S); break;
      case 3: scores(3, 1, QT, D, K, kv_sr, j, scale, S); break;
      default: scores(4, 1, QT, D, K, kv_sr, j, scale, S); break;
    }
}

/* Adds keys j0..j1 (the lane's own: all below `shared`, then those `member` marks) into the
   running sums O[lane][:] of T lanes from l0: O += w[j][lane] * V[j], in key order. The sums
   go through memory between blocks of keys, exactly (a float stored is the float loaded), so
   a lane's sum is the same sequence of fused multiply-adds whatever the blocking. */
TARGET INLINE void weighted(const int T, const int C, const float *S, int l0, const float *V,
                            long kv_sr, int j0, int j1, int shared, const uint64_t *member,
                            float *O, int D, int first) {
  __m512 acc[3][MAX_C];
  for (int t = 0; t < T; t++)
    for (int c = 0; c < C; c++)
      acc[t][c] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(O + (l0 + t) * D + c * 16);
  for (int j = j0; j < j1; j++) {
    const float *v = V + (long)j * kv_sr;
    const uint64_t m = j < shared ? ~(uint64_t)0 : member[j - shared];
    for (int t = 0; t < T; t++) {
      if (!((m >> (l0 + t)) & 1)) continue;
      const __m512 w = _mm512_set1_ps(S[(long)j * LANES + l0 + t]);
      for (int c = 0; c < C; c++)
        acc[t][c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(v + c * 16), acc[t][c]);
    }
  }
  for (int t = 0; t < T; t++)
    for (int c = 0; c < C; c++) _mm512_storeu_ps(O + (l0 + t) * D + c * 16, acc[t][c]);
}

/* One unit: lanes lane0 .. lane0+nl of one key/value head's query vectors (qv = row * R + h). */
TARGET static void unit(const float *q, long q_sr, long q_sh, int R, int D, int gh, int lane0,
                        int nl, const float *K, const float *V, long kv_sr, const int32_t *prefix,
                        const int32_t *offset, const int32_t *count, const int32_t *extra,
                        float scale, float *out, int H, float *QT, float *S, uint64_t *member,
                        float *O) {
  const int G = (nl + 15) / 16, C = D / 16;
  int shared = 1 << 30, span = 0;
  for (int l = 0; l < nl; l++) {
    const int row = (lane0 + l) / R;
    int end = prefix[row];
    if (count[row]) {
      const int last = extra[offset[row] + count[row] - 1] + 1;
      end = last > end ? last : end;
    }
    shared = prefix[row] < shared ? prefix[row] : shared;
    span = end > span ? end : span;
  }
  memset(QT, 0, sizeof(float) * D * LANES);
  for (int l = 0; l < nl; l++) {
    const int row = (lane0 + l) / R, h = gh * R + (lane0 + l) % R;
    const float *qv = q + row * q_sr + h * q_sh;
    for (int d = 0; d < D; d++) QT[d * LANES + l] = qv[d];
  }
  for (int j = shared; j < span; j++) {
    uint64_t m = 0;
    for (int l = 0; l < nl; l++) {
      const int row = (lane0 + l) / R;
      int in = j < prefix[row];
      for (int e = 0; e < count[row] && !in; e++) in = extra[offset[row] + e] == j;
      m |= (uint64_t)in << l;
    }
    member[j - shared] = m;
  }
  all_scores(G, QT, D, K, kv_sr, span, scale, S);
  float inv[LANES];
  for (int g = 0; g < G; g++) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < shared; j++)
      mx = _mm512_max_ps(mx, _mm512_loadu_ps(S + (long)j * LANES + g * 16));
    for (int j = shared; j < span; j++)
      mx = _mm512_mask_max_ps(mx, (__mmask16)(member[j - shared] >> (g * 16)), mx,
                              _mm512_loadu_ps(S + (long)j * LANES + g * 16));
    __m512 sum = _mm512_setzero_ps();
    for (int j = 0; j < shared; j++) {
      float *s = S + (long)j * LANES + g * 16;
      const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s), mx));
      _mm512_storeu_ps(s, e);
      sum = _mm512_add_ps(sum, e);
    }
    for (int j = shared; j < span; j++) {
      float *s = S + (long)j * LANES + g * 16;
      const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s), mx));
      _mm512_storeu_ps(s, e);
      sum = _mm512_mask_add_ps(sum, (__mmask16)(member[j - shared] >> (g * 16)), sum, e);
    }
    _mm512_storeu_ps(inv + g * 16, _mm512_div_ps(_mm512_set1_ps(1.0f), sum));
  }
  for (int j0 = 0; j0 < span; j0 += KEY_BLOCK) { /* a block's values stay in L1 for all lanes */
    const int j1 = span - j0 < KEY_BLOCK ? span : j0 + KEY_BLOCK, first = j0 == 0;
    for (int l = 0; l < nl;) {
      const int T = (C == 8 || C == 4) && nl - l >= 3 ? 3 : 1; /* lanes this pass */
      if (C == 8 && T == 3)
        weighted(3, 8, S, l, V, kv_sr, j0, j1, shared, member, O, D, first);
      else if (C == 8)
        weighted(1, 8, S, l, V, kv_sr, j0, j1, shared, member, O, D, first);
      else if (C == 4 && T == 3)
        weighted(3, 4, S, l, V, kv_sr, j0, j1, shared, member, O, D, first);
      else if (C == 4)
        weighted(1, 4, S, l, V, kv_sr, j0, j1, shared, member, O, D, first);
      else
        weighted(1, C, S, l, V, kv_sr, j0, j1, shared, member, O, D, first);
      l += T;
    }
  }
  for (int l = 0; l < nl; l++) {
    const int row = (lane0 + l) / R, h = gh * R + (lane0 + l) % R;
    const __m512 iv = _mm512_set1_ps(inv[l]);
    for (int c = 0; c < C; c++)
      _mm512_storeu_ps(out + ((long)row * H + h) * D + c * 16,
                       _mm512_mul_ps(_mm512_loadu_ps(O + l * D + c * 16), iv));
  }
}

/* Floats of scratch a unit needs: its transposed queries, its scores (keys x LANES), and a
   64-bit mask per key past the rows' shared prefix (which lanes it belongs to). */
static long unit_scratch_floats(int D, int span) {
  return 2L * D * LANES + (long)span * LANES + 2L * span + 16;
}

/* Units of work a call makes (each one key/value head's query vectors, LANES at a time). */
int qd_attend_units(int Q, int H, int KVH) { return KVH * ((Q * (H / KVH) + LANES - 1) / LANES); }

/* Floats of scratch a call needs. */
long qd_attend_scratch_floats(int Q, int H, int D, int KVH, int span) {
  return qd_attend_units(Q, H, KVH) * unit_scratch_floats(D, span);
}

/* out[Q, H, D] (contiguous) for the Q query rows q (H heads of D floats; strides q_sr between
   rows, q_sh between heads, 1 within a head) over the cache's keys and values (KVH heads of
   positions kv_sr floats apart, heads kv_sh apart, the same for both). Query head h reads
   key/value head h / (H / KVH). Row r attends to positions [0, prefix[r]), then to
   extra[offset[r] .. offset[r] + count[r]) (ascending, each >= prefix[r]); `span` is past the
   last position any row reads. `scratch` holds qd_attend_scratch_floats(Q, H, D, KVH, span)
   floats. Returns 0, or -1 for shapes it does not take (D not whole chunks of 16, H not whole
   groups of KVH). */
TARGET int qd_attend_rows(const float *q, int Q, int H, int D, long q_sr, long q_sh,
                          const float *key, const float *value, int KVH, long kv_sh, long kv_sr,
                          const int32_t *prefix, const int32_t *offset, const int32_t *count,
                          const int32_t *extra, int span, float scale, float *out, float *scratch,
                          int threads) {
  if (D % 16 || D > 16 * MAX_C || KVH < 1 || H % KVH) return -1;
  const int R = H / KVH, per_head = (Q * R + LANES - 1) / LANES, units = KVH * per_head;
  const long each = unit_scratch_floats(D, span);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int u = 0; u < units; u++) {
    float *mine = scratch + u * each;
    float *QT = mine, *O = QT + D * LANES, *S = O + D * LANES;
    uint64_t *member = (uint64_t *)(((uintptr_t)(S + (long)span * LANES) + 63) & ~(uintptr_t)63);
    const int g = u / per_head, lane0 = (u % per_head) * LANES;
    const int nl = Q * R - lane0 < LANES ? Q * R - lane0 : LANES;
    unit(q, q_sr, q_sh, R, D, g, lane0, nl, key + g * kv_sh, value + g * kv_sh, kv_sr, prefix,
         offset, count, extra, scale, out, H, QT, S, member, O);
  }
  return 0;
}
