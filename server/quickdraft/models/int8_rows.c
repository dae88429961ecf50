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
   oneDNN's general kernel read it at two thirds of it.

   Where the CPU has AMX, `qd_int8_tiles` takes any number of rows from the same layout: a
   64-byte row of the layout is a row of an AMX weight tile as it stands (16 channels x 4
   inputs), so 16 of them, 1 KB in a row, are one tile of 64 inputs, and the quantized rows
   are the other tile as they lie in memory (16 rows x 64 inputs, K bytes apart). One tile
   multiply sums 16 rows x 16 channels x 64 inputs in int32, exactly; the sums get the same
   correction and scalings as above, so the outputs are bitwise the same again. It reads the
   weights at memory speed up to 16 rows and is faster than oneDNN's kernel at every row count
   measured (1 to 512; `quantize.fast_rows` confirms it per machine). */

#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
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

/* y_row[n..n+16) from a row's 16 exact sums: the correction taken back, then
   ((float)sum * sw[n]) * sx (+ bias[n]), each operation rounded once (the formula above). Every
   kernel here finishes through it, so all give the same bits. */
TARGET static inline void store_scaled(__m512i acc, int32_t sum128, float sx, const float *sw,
                                       const float *bias, int n, float *y_row) {
  const __m512 sums = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc, _mm512_set1_epi32(sum128)));
  __m512 v = _mm512_mul_ps(_mm512_mul_ps(sums, _mm512_loadu_ps(sw + n)), _mm512_set1_ps(sx));
  if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias + n));
  _mm512_storeu_ps(y_row + n, v);
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
  for (int r = 0; r < M; r++)
    for (int c = 0; c < CB; c++)
      store_scaled(acc[r][c], sum128[r], sx[r], sw, bias, (b0 + c) * 16, y + (size_t)r * N);
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

/* ---- AMX tiles: any number of rows ---- */

#if defined(__clang__) ? (__clang_major__ >= 12) : (defined(__GNUC__) && __GNUC__ >= 11)
#include <sys/syscall.h>
#include <unistd.h>
#define TILES_TARGET __attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vnni")))
#define TILE_ROWS 16
#define TILE_BYTES 1024 /* 16 rows x 64 bytes */

typedef struct {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} tile_config;

/* Asks Linux for the AMX tile state (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA), which a process
   needs before its first tile instruction. 0: granted. */
int qd_tiles_enable(void) { return (int)syscall(SYS_arch_prctl, 0x1023, 18); }

/* Rows r0..r0+rows) of channel block b from their int32 sums c[rows][16] (`store_scaled`). */
TARGET static void scale_sums(const int32_t *c, int rows, int r0, int b, const int32_t *sum128,
                              const float *sx, const float *sw, const float *bias, float *y,
                              int N) {
  for (int i = 0; i < rows; i++) {
    const int r = r0 + i;
    const __m512i acc = _mm512_loadu_si512((const void *)(c + i * 16));
    store_scaled(acc, sum128[r], sx[r], sw, bias, b * 16, y + (size_t)r * N);
  }
}

/* Tiles 0-3 hold a pass's int32 sums. */
TILES_TARGET static inline void zero_sums(void) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

TILES_TARGET static inline void store_sums(int32_t c[4][TILE_ROWS * 16]) {
  _tile_stored(0, c[0], 64);
  _tile_stored(1, c[1], 64);
  _tile_stored(2, c[2], 64);
  _tile_stored(3, c[3], 64);
}

/* Up to 16 rows (one tile of them, zero-padded): 4 channel blocks per pass, each weight tile
   used once. Tiles: 0-3 sums, 4 the rows, 5-7 weights. */
TILES_TARGET static void one_row_tile(int M, int K, const uint8_t *wb, int N, const int8_t *xq,
                                      const int32_t *sum128, const float *sx, const float *sw,
                                      const float *bias, float *y) {
  const int KB = K / 64, groups = N / 64;
  const size_t block = (size_t)K / 4 * 64;
  int32_t c[4][TILE_ROWS * 16];
#pragma omp for schedule(static)
  for (int g = 0; g < groups; g++) {
    const uint8_t *w = wb + (size_t)g * 4 * block;
    zero_sums();
    for (int kb = 0; kb < KB; kb++) {
      const size_t at = (size_t)kb * TILE_BYTES;
      _tile_loadd(4, xq + kb * 64, K);
      _tile_loadd(5, w + at, 64);
      _tile_dpbsud(0, 4, 5);
      _tile_loadd(6, w + block + at, 64);
      _tile_dpbsud(1, 4, 6);
      _tile_loadd(7, w + 2 * block + at, 64);
      _tile_dpbsud(2, 4, 7);
      _tile_loadd(5, w + 3 * block + at, 64);
      _tile_dpbsud(3, 4, 5);
    }
    store_sums(c);
    for (int i = 0; i < 4; i++) scale_sums(c[i], M, 0, g * 4 + i, sum128, sx, sw, bias, y, N);
  }
}

/* Any rows, in pairs of row tiles (zero-padded to 32): 2 channel blocks per pass, the pass's
   weights (2 x K x 16 bytes) read from memory for the first pair and from cache after. Tiles:
   0-3 sums (row tile x block), 4-5 the rows, 6-7 weights. */
TILES_TARGET static void row_tile_pairs(int M, int K, const uint8_t *wb, int N, const int8_t *xq,
                                        const int32_t *sum128, const float *sx, const float *sw,
                                        const float *bias, float *y) {
  const int KB = K / 64, groups = N / 32, pairs = (M + 31) / 32;
  const size_t block = (size_t)K / 4 * 64;
  int32_t c[4][TILE_ROWS * 16];
#pragma omp for schedule(static)
  for (int g = 0; g < groups; g++) {
    const uint8_t *w = wb + (size_t)g * 2 * block;
    for (int p = 0; p < pairs; p++) {
      const int8_t *rows = xq + (size_t)p * 32 * K;
      zero_sums();
      for (int kb = 0; kb < KB; kb++) {
        const size_t at = (size_t)kb * TILE_BYTES;
        _tile_loadd(4, rows + kb * 64, K);
        _tile_loadd(6, w + at, 64);
        _tile_dpbsud(0, 4, 6);
        _tile_loadd(5, rows + (size_t)16 * K + kb * 64, K);
        _tile_dpbsud(1, 5, 6);
        _tile_loadd(7, w + block + at, 64);
        _tile_dpbsud(2, 4, 7);
        _tile_dpbsud(3, 5, 7);
      }
      store_sums(c);
      const int r0 = p * 32, left = M - r0;
      const int first = left < 16 ? left : 16, second = left - first < 16 ? left - first : 16;
      scale_sums(c[0], first, r0, g * 2, sum128, sx, sw, bias, y, N);
      scale_sums(c[2], first, r0, g * 2 + 1, sum128, sx, sw, bias, y, N);
      if (second > 0) {
        scale_sums(c[1], second, r0 + 16, g * 2, sum128, sx, sw, bias, y, N);
        scale_sums(c[3], second, r0 + 16, g * 2 + 1, sum128, sx, sw, bias, y, N);
      }
    }
  }
}

/* y[M, N] from x[M, K] as qd_int8_rows computes it, for any M >= 1, with AMX tiles (the caller
   has had qd_tiles_enable() grant them). N % 32 == 0 and K % 64 == 0; xq a scratch of
   ceil(M / 32) * 32 * K bytes (the rows padded with zeros to whole pairs of tiles). Returns 0,
   or -1 for shapes it does not take (nothing written then). */
TILES_TARGET int qd_int8_tiles(const float *x, int M, int K, const uint8_t *wb, int N,
                               const float *sw, const float *bias, float *y, int8_t *xq,
                               int threads) {
  if (M < 1 || N % 32 || K % 64 || K < 64) return -1;
  const int single = M <= TILE_ROWS && N % 64 == 0;
  const int padded = single ? TILE_ROWS : (M + 31) / 32 * 32;
  float *sx = malloc(sizeof(float) * M);
  int32_t *sum128 = malloc(sizeof(int32_t) * M);
  if (!sx || !sum128) {
    free(sx);
    free(sum128);
    return -1;
  }
#pragma omp parallel for schedule(static) num_threads(threads) if (M >= 8)
  for (int r = 0; r < M; r++)
    quantize_row(x + (size_t)r * K, K, xq + (size_t)r * K, &sx[r], &sum128[r]);
  memset(xq + (size_t)M * K, 0, (size_t)(padded - M) * K);
#pragma omp parallel num_threads(threads)
  {
    tile_config config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; t++) {
      config.rows[t] = TILE_ROWS;
      config.colsb[t] = 64;
    }
    _tile_loadconfig(&config);
    if (single)
      one_row_tile(M, K, wb, N, xq, sum128, sx, sw, bias, y);
    else
      row_tile_pairs(M, K, wb, N, xq, sum128, sx, sw, bias, y);
    _tile_release(); /* oneDNN, in the same threads, configures its own before each use */
  }
  free(sx);
  free(sum128);
  return 0;
}

#else /* a compiler without AMX intrinsics: the tiles are never used */
int qd_tiles_enable(void) { return -1; }
int qd_int8_tiles(const float *x, int M, int K, const uint8_t *wb, int N, const float *sw,
                  const float *bias, float *y, int8_t *xq, int threads) {
  return -1;
}
#endif
