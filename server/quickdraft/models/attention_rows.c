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

/* QT[d][lane]: the query vectors of lanes lane0 .. lane0+nl of key/value head gh (lane l is
   row (lane0 + l) / R, head gh * R + (lane0 + l) % R), rows `stride` floats apart, zeros in
   the lanes past nl. */
INLINE void transpose_queries(const float *q, long q_sr, long q_sh, int R, int D, int gh,
                              int lane0, int nl, float *QT, int stride) {
  memset(QT, 0, sizeof(float) * D * stride);
  for (int l = 0; l < nl; l++) {
    const int row = (lane0 + l) / R, h = gh * R + (lane0 + l) % R;
    const float *qv = q + row * q_sr + h * q_sh;
    for (int d = 0; d < D; d++) QT[d * stride + l] = qv[d];
  }
}

/* For each key j in [shared, span): `words` 64-bit masks of the lanes whose row reads it (its
   prefix, then its listed positions), lane l's bit l % 64 of word l / 64. */
INLINE void mark_members(int R, int lane0, int nl, const int32_t *prefix, const int32_t *offset,
                         const int32_t *count, const int32_t *extra, int shared, int span,
                         uint64_t *member, int words) {
  for (int j = shared; j < span; j++) {
    uint64_t *m = member + (long)words * (j - shared);
    for (int w = 0; w < words; w++) m[w] = 0;
    for (int l = 0; l < nl; l++) {
      const int row = (lane0 + l) / R;
      int in = j < prefix[row];
      for (int e = 0; e < count[row] && !in; e++) in = extra[offset[row] + e] == j;
      m[l >> 6] |= (uint64_t)in << (l & 63);
    }
  }
}

/* The lanes of group g (16) that read key j >= shared: their bits in the key's `words` 64-bit
   masks (lane l's bit l % 64 of word l / 64). */
INLINE __mmask16 group_reads(const uint64_t *member, int words, int shared, int j, int g) {
  return (__mmask16)(member[(long)words * (j - shared) + (g >> 2)] >> ((g & 3) * 16));
}

/* For group g's lanes (scores S[j][lane], rows `stride` floats apart, less their maximum mx):
   e_j = exp(s_j - mx) in place, and 1 / (the sum of a lane's own e_j, in key order) into inv. */
TARGET INLINE void exponentiate(float *S, long stride, int g, int shared, int span, __m512 mx,
                                const uint64_t *member, int words, float *inv) {
  __m512 sum = _mm512_setzero_ps();
  for (int j = 0; j < shared; j++) {
    float *s = S + (long)j * stride + g * 16;
    const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s), mx));
    _mm512_storeu_ps(s, e);
    sum = _mm512_add_ps(sum, e);
  }
  for (int j = shared; j < span; j++) {
    float *s = S + (long)j * stride + g * 16;
    const __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(s), mx));
    _mm512_storeu_ps(s, e);
    sum = _mm512_mask_add_ps(sum, group_reads(member, words, shared, j, g), sum, e);
  }
  _mm512_storeu_ps(inv + g * 16, _mm512_div_ps(_mm512_set1_ps(1.0f), sum));
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
  transpose_queries(q, q_sr, q_sh, R, D, gh, lane0, nl, QT, LANES);
  mark_members(R, lane0, nl, prefix, offset, count, extra, shared, span, member, 1);
  all_scores(G, QT, D, K, kv_sr, span, scale, S);
  float inv[LANES];
  for (int g = 0; g < G; g++) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < shared; j++)
      mx = _mm512_max_ps(mx, _mm512_loadu_ps(S + (long)j * LANES + g * 16));
    for (int j = shared; j < span; j++)
      mx = _mm512_mask_max_ps(mx, group_reads(member, 1, shared, j, g), mx,
                              _mm512_loadu_ps(S + (long)j * LANES + g * 16));
    exponentiate(S, LANES, g, shared, span, mx, member, 1, inv);
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

/* Floats of scratch a unit needs: its transposed queries, its sums, its scores (keys x LANES),
   and a 64-bit mask per key past the rows' shared prefix (which lanes it belongs to). */
static long unit_scratch_floats(int D, int span) {
  return 2L * D * LANES + (long)span * LANES + 2L * span + 16;
}

/* Units of work a call makes (each one key/value head's query vectors, LANES at a time). */
int qd_attend_units(int Q, int H, int KVH) { return KVH * ((Q * (H / KVH) + LANES - 1) / LANES); }

/* The tiles' units (`qd_attend_rows_tiles`): TILE_LANES query vectors, so that a 16-row
   forward of a model with 6 query heads per key/value head reads each key and value once. */
#define TILE_LANES 128
#define SCORE_KEYS 16 /* keys a score tile holds */
#define VALUE_KEYS 32 /* keys a value tile adds: 16 pairs */

static long padded_span(int span) { return ((long)span + VALUE_KEYS - 1) / VALUE_KEYS * VALUE_KEYS; }

/* Floats of scratch a tiles unit needs: its transposed queries, its sums, its scores, two
   64-bit masks per key, and in bfloat16 its queries, a block of keys, the values and the
   weights as the tiles read them. */
static long tile_unit_floats(int D, int span) {
  const long keys = padded_span(span), groups = TILE_LANES / 16;
  return 2L * D * TILE_LANES + keys * TILE_LANES + 4 * keys + 16 + groups * 8L * D + 8L * D +
         keys * D / 2 + groups * keys * 8 + 64;
}

static int tile_units(int Q, int H, int KVH) {
  return KVH * ((Q * (H / KVH) + TILE_LANES - 1) / TILE_LANES);
}

/* Floats of scratch a call needs (either arithmetic). */
long qd_attend_scratch_floats(int Q, int H, int D, int KVH, int span) {
  const long rows = qd_attend_units(Q, H, KVH) * unit_scratch_floats(D, span);
  const long tiles = tile_units(Q, H, KVH) * tile_unit_floats(D, span);
  return rows > tiles ? rows : tiles;
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

/* ---- AMX bfloat16 tiles: the same rows, most of their products on the tiles ----

   Where the CPU has AMX's bfloat16 tiles, `qd_attend_rows_tiles` computes what qd_attend_rows
   does with another fixed arithmetic, still the same for a row whatever else the call holds:
     s_j  = (q . k_j in bfloat16 pairs, float32 sums: one tile product per 32 dimensions, in
             order) * scale, for every key of the row (a product depends on q and k_j alone);
     m, e_j and sum as above, in float32, in key order;
     out  = (the float32 sums of bf16(e_j) * bf16(v_j) over the row's first A keys, on tiles,
             blocks of 32 keys in order, each block's 16 pairs as the tile adds them; then
             e_j * v_j over its remaining keys in key order, fused, in float32) * (1 / sum),
   where a row of L keys (its prefix and path) takes A = 32 * floor((L - FP32_TAIL) / 32)
   keys on the tiles (none when L < FP32_TAIL + 32). A depends on L alone, and A <= the
   row's prefix (no row of a decode, verify or tree forward has FP32_TAIL keys past its prefix),
   so the tiles only ever see a row's own contiguous prefix, from key 0, and a lane whose A is
   smaller than its neighbours' gets weights of exactly 0 in whole blocks (adding 0 x v to a
   float32 sum leaves it as it was). */

#if defined(__clang__) ? (__clang_major__ >= 12) : (defined(__GNUC__) && __GNUC__ >= 11)
#include <sys/syscall.h>
#include <unistd.h>
#define TILES_TARGET \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512dq,avx512bf16")))
#define FP32_TAIL 96 /* keys (at least) of a row added in float32, after its tiles */

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} attend_tile_config;

/* Asks Linux for the AMX tile state (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA). 0: granted. */
int qd_attend_tiles_enable(void) { return (int)syscall(SYS_arch_prctl, 0x1023, 18); }

static const uint16_t PAIR_ORDER[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                        8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

static const int32_t TURN[16] = {0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240};

/* 32 bfloat16 (nearest even): a[0], b[0], a[1], b[1], ... (a tile's pairs). */
TILES_TARGET INLINE __m512i bf16_pairs(__m512 a, __m512 b) {
  const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(b, a); /* words 0-15 a, 16-31 b */
  return _mm512_permutexvar_epi16(_mm512_loadu_si512((const void *)PAIR_ORDER), both);
}

/* 32 bfloat16 of lo[0..16), hi[0..16) in order. */
TILES_TARGET INLINE __m512i bf16_run(__m512 lo, __m512 hi) {
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

#define SCORE_GROUP(g)                                   \
  do {                                                   \
    _tile_loadd(5, Q4 + ((g) * CH + c) * 512, 64);       \
    _tile_dpbf16ps(g, 4, 5);                             \
  } while (0)

/* Scores S[j][lane] (unscaled, rows TL floats apart) for every key j < span, G groups of 16
   lanes, four at a time on tiles 0-3. QB: the queries as the tiles read them; KB: a block of
   SCORE_KEYS keys in bfloat16, converted once for all groups. */
TILES_TARGET static void tile_scores(int G, int D, const uint16_t *QB, const float *K, long kv_sr,
                                     int span, uint16_t *KB, float *S, int TL) {
  const int CH = D / 32;
  for (int j0 = 0; j0 < span; j0 += SCORE_KEYS) {
    for (int r = 0; r < SCORE_KEYS; r++) {
      uint16_t *row = KB + r * D;
      if (j0 + r < span) {
        const float *k = K + (long)(j0 + r) * kv_sr;
        for (int c = 0; c < CH; c++)
          _mm512_storeu_si512((void *)(row + c * 32),
                              bf16_run(_mm512_loadu_ps(k + c * 32), _mm512_loadu_ps(k + c * 32 + 16)));
      } else {
        memset(row, 0, sizeof(uint16_t) * D);
      }
    }
    for (int g0 = 0; g0 < G; g0 += 4) {
      const int n = G - g0 < 4 ? G - g0 : 4;
      const uint16_t *Q4 = QB + (long)g0 * CH * 512;
      _tile_zero(0);
      if (n > 1) _tile_zero(1);
      if (n > 2) _tile_zero(2);
      if (n > 3) _tile_zero(3);
      for (int c = 0; c < CH; c++) {
        _tile_loadd(4, KB + c * 32, D * 2);
        SCORE_GROUP(0);
        if (n > 1) SCORE_GROUP(1);
        if (n > 2) SCORE_GROUP(2);
        if (n > 3) SCORE_GROUP(3);
      }
      float *out = S + (long)j0 * TL + g0 * 16;
      _tile_stored(0, out, TL * 4);
      if (n > 1) _tile_stored(1, out + 16, TL * 4);
      if (n > 2) _tile_stored(2, out + 32, TL * 4);
      if (n > 3) _tile_stored(3, out + 48, TL * 4);
    }
  }
}

/* Whether lane l reads key j (j >= shared: its bit in the key's two masks, `mark_members`). */
INLINE int reads(const uint64_t *member, int shared, int j, int l) {
  return j < shared || ((member[2 * (j - shared) + (l >> 6)] >> (l & 63)) & 1);
}

TILES_TARGET static void tile_unit(const float *q, long q_sr, long q_sh, int R, int D, int gh,
                                   int lane0, int nl, const float *K, const float *V, long kv_sr,
                                   const int32_t *prefix, const int32_t *offset,
                                   const int32_t *count, const int32_t *extra, float scale,
                                   float *out, int H, float *scratch, int span) {
  /* Rows of the unit's queries and scores are TL floats: its lanes, in whole groups. */
  const int G = (nl + 15) / 16, C = D / 16, CH = D / 32, TL = G * 16;
  const long keys = padded_span(span);
  float *QT = scratch, *O = QT + D * TL, *S = O + D * TL;
  uint64_t *member = (uint64_t *)(((uintptr_t)(S + keys * TL) + 63) & ~(uintptr_t)63);
  uint16_t *QB = (uint16_t *)(((uintptr_t)(member + 2 * keys) + 63) & ~(uintptr_t)63);
  uint16_t *KB = QB + (TL / 16) * 16 * D; /* groups x CH chunks x 16 x 32 */
  uint16_t *VB = KB + SCORE_KEYS * D;     /* blocks x C chunks x 16 x 32 */
  uint16_t *PT = VB + keys * D;           /* groups x blocks x 16 lanes x 32 keys */
  int shared = 1 << 30, tiled[TILE_LANES], tiled_max = 0;
  for (int l = 0; l < TILE_LANES; l++) tiled[l] = 0;
  for (int l = 0; l < nl; l++) {
    const int row = (lane0 + l) / R;
    const int length = prefix[row] + count[row];
    const int a = length >= FP32_TAIL + VALUE_KEYS ? (length - FP32_TAIL) / VALUE_KEYS * VALUE_KEYS : 0;
    tiled[l] = a;
    tiled_max = a > tiled_max ? a : tiled_max;
    shared = prefix[row] < shared ? prefix[row] : shared;
  }
  transpose_queries(q, q_sr, q_sh, R, D, gh, lane0, nl, QT, TL);
  mark_members(R, lane0, nl, prefix, offset, count, extra, shared, span, member, 2);
  for (int g = 0; g < G; g++)
    for (int c = 0; c < CH; c++)
      for (int kk = 0; kk < 16; kk++) {
        const float *even = QT + (c * 32 + 2 * kk) * TL + g * 16;
        _mm512_storeu_si512((void *)(QB + (g * CH + c) * 512 + kk * 32),
                            bf16_pairs(_mm512_loadu_ps(even), _mm512_loadu_ps(even + TL)));
      }
  tile_scores(G, D, QB, K, kv_sr, span, KB, S, TL);
  const __m512 sv = _mm512_set1_ps(scale);
  float inv[TILE_LANES];
  for (int g = 0; g < G; g++) {
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < span; j++) {
      float *s = S + (long)j * TL + g * 16;
      const __m512 scaled = _mm512_mul_ps(_mm512_loadu_ps(s), sv);
      _mm512_storeu_ps(s, scaled);
      mx = j < shared ? _mm512_max_ps(mx, scaled)
                      : _mm512_mask_max_ps(mx, group_reads(member, 2, shared, j, g), mx, scaled);
    }
    exponentiate(S, TL, g, shared, span, mx, member, 2, inv);
  }
  /* The tiles: the weighted values of each lane's first `tiled` keys. */
  const int blocks = tiled_max / VALUE_KEYS;
  if (blocks) {
    for (int b = 0; b < blocks; b++)
      for (int c = 0; c < C; c++)
        for (int kk = 0; kk < 16; kk++) {
          const float *even = V + (long)(b * VALUE_KEYS + 2 * kk) * kv_sr + c * 16;
          _mm512_storeu_si512((void *)(VB + ((long)b * C + c) * 512 + kk * 32),
                              bf16_pairs(_mm512_loadu_ps(even), _mm512_loadu_ps(even + kv_sr)));
        }
    /* A lane's weights as a tile reads them: a row of 32 keys (16 pairs) per lane; keys past
       its `tiled` count 0. Made as pairs per key pair (16 lanes each), then turned. */
    const __m512i turn = _mm512_loadu_si512((const void *)TURN);
    for (int g = 0; g < G; g++)
      for (int b = 0; b < blocks; b++) {
        int32_t pairs[256] __attribute__((aligned(64)));
        __mmask16 in = 0;
        for (int n = 0; n < 16; n++) in |= (__mmask16)(b * VALUE_KEYS < tiled[g * 16 + n]) << n;
        for (int kk = 0; kk < 16; kk++) {
          const float *even = S + (long)(b * VALUE_KEYS + 2 * kk) * TL + g * 16;
          _mm512_store_si512((void *)(pairs + kk * 16),
                             bf16_pairs(_mm512_maskz_mov_ps(in, _mm512_loadu_ps(even)),
                                        _mm512_maskz_mov_ps(in, _mm512_loadu_ps(even + TL))));
        }
        uint16_t *tile = PT + ((long)g * blocks + b) * 512;
        for (int n = 0; n < 16; n++)
          _mm512_storeu_si512((void *)(tile + n * 32),
                              _mm512_i32gather_epi32(_mm512_add_epi32(turn, _mm512_set1_epi32(n)),
                                                     pairs, 4));
      }
    for (int g = 0; g < G; g++)
      for (int c = 0; c < C; c++) {
        _tile_zero(0);
        for (int b = 0; b < blocks; b++) {
          _tile_loadd(1, PT + ((long)g * blocks + b) * 512, 64);
          _tile_loadd(2, VB + ((long)b * C + c) * 512, 64);
          _tile_dpbf16ps(0, 1, 2);
        }
        _tile_stored(0, O + (long)g * 16 * D + c * 16, D * 4);
      }
  }
  /* Then each lane's remaining keys in float32, in key order. */
  for (int l = 0; l < nl; l++) {
    __m512 acc[MAX_C];
    for (int c = 0; c < C; c++)
      acc[c] = blocks ? _mm512_loadu_ps(O + (long)l * D + c * 16) : _mm512_setzero_ps();
    for (int j = tiled[l]; j < span; j++) {
      if (!reads(member, shared, j, l)) continue;
      const float *v = V + (long)j * kv_sr;
      const __m512 w = _mm512_set1_ps(S[(long)j * TL + l]);
      for (int c = 0; c < C; c++) acc[c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(v + c * 16), acc[c]);
    }
    const int row = (lane0 + l) / R, h = gh * R + (lane0 + l) % R;
    const __m512 iv = _mm512_set1_ps(inv[l]);
    for (int c = 0; c < C; c++)
      _mm512_storeu_ps(out + ((long)row * H + h) * D + c * 16, _mm512_mul_ps(acc[c], iv));
  }
}

/* As qd_attend_rows, on AMX bfloat16 tiles (the arithmetic above; the caller has had
   qd_attend_tiles_enable() grant them). Returns -1, nothing written, for shapes it does not take
   (those of qd_attend_rows, D not whole chunks of 32, or a row with more than FP32_TAIL keys past
   its prefix). */
TILES_TARGET int qd_attend_rows_tiles(const float *q, int Q, int H, int D, long q_sr, long q_sh,
                                      const float *key, const float *value, int KVH, long kv_sh,
                                      long kv_sr, const int32_t *prefix, const int32_t *offset,
                                      const int32_t *count, const int32_t *extra, int span,
                                      float scale, float *out, float *scratch, int threads) {
  if (D % 32 || D > 16 * MAX_C || KVH < 1 || H % KVH) return -1;
  for (int r = 0; r < Q; r++)
    if (count[r] > FP32_TAIL) return -1;
  const int R = H / KVH, per_head = (Q * R + TILE_LANES - 1) / TILE_LANES;
  const int units = tile_units(Q, H, KVH);
  const long each = tile_unit_floats(D, span);
#pragma omp parallel num_threads(threads)
  {
    attend_tile_config config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; t++) {
      config.rows[t] = 16;
      config.colsb[t] = 64;
    }
    _tile_loadconfig(&config);
#pragma omp for schedule(dynamic, 1)
    for (int u = 0; u < units; u++) {
      const int g = u / per_head, lane0 = (u % per_head) * TILE_LANES;
      const int nl = Q * R - lane0 < TILE_LANES ? Q * R - lane0 : TILE_LANES;
      tile_unit(q, q_sr, q_sh, R, D, g, lane0, nl, key + g * kv_sh, value + g * kv_sh, kv_sr,
                prefix, offset, count, extra, scale, out, H, scratch + u * each, span);
    }
    _tile_release();
  }
  return 0;
}

#else /* a compiler without AMX intrinsics: the tiles are never used */
int qd_attend_tiles_enable(void) { return -1; }
int qd_attend_rows_tiles(const float *q, int Q, int H, int D, long q_sr, long q_sh,
                         const float *key, const float *value, int KVH, long kv_sh, long kv_sr,
                         const int32_t *prefix, const int32_t *offset, const int32_t *count,
                         const int32_t *extra, int span, float scale, float *out, float *scratch,
                         int threads) {
  return -1;
}
#endif
