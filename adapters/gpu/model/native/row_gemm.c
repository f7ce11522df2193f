/* Batch-invariant linear layers on the CPU: out[r, o] = rows[r] . weight[o] (+ bias[o]).
 *
 * Every output element is reduced in one fixed order, whatever the row count, the tile it falls
 * in or the thread that computes it: 16 lane accumulators, where lane l takes the products of
 * the inner indices k = l (mod 16) in increasing k, each with one fused multiply-add (an inner
 * size that is no multiple of 16 ends with zero products); then the lanes are combined by a
 * fixed tree (l + 8, then + 4, + 2, + 1) and the bias is added. Tiles of rows and outputs only
 * decide which dot products run side by side in registers, and threads only split the outputs,
 * so a row's bits cannot depend on its neighbours: batch invariance by construction, where
 * BLAS kernels choose their order by the row count.
 *
 * The weights stream once per block of up to BLOCK_ROWS rows, so a decode step of one row costs
 * one pass over the weights like a matrix-vector product. The same lanes run as one AVX-512
 * vector, two AVX2 vectors or sixteen scalar fmaf calls, giving the same bits; the widest the
 * CPU runs is chosen on first use. `make` builds it with -ffp-contract=off -fno-fast-math so the
 * only fused operations are the explicit ones and no sum is reordered.
 */
#include "../../native_width.h"
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define EXPORT __attribute__((visibility("default")))
#define LANES 16
#define BLOCK_ROWS 64 /* rows whose inputs stay in cache while the weights stream past */

/* ---- sixteen scalar lanes: the portable definition of the order ---- */
typedef struct {
    float v[LANES];
} lanes_s;

INLINE lanes_s zero_s(void) {
    lanes_s z;
    for (int i = 0; i < LANES; i++) z.v[i] = 0.0f;
    return z;
}

INLINE lanes_s load_s(const float *at, int64_t count) {
    lanes_s x = zero_s();
    for (int64_t i = 0; i < count; i++) x.v[i] = at[i];
    return x;
}

INLINE lanes_s fma_s(lanes_s a, lanes_s b, lanes_s acc) {
    for (int i = 0; i < LANES; i++) acc.v[i] = fmaf(a.v[i], b.v[i], acc.v[i]);
    return acc;
}

INLINE lanes_s splat_s(float value) {
    lanes_s x;
    for (int i = 0; i < LANES; i++) x.v[i] = value;
    return x;
}

INLINE void store_s(float *at, lanes_s x, int64_t count) {
    for (int64_t i = 0; i < count; i++) at[i] = x.v[i];
}

INLINE float sum_s(lanes_s x) {
    float s8[8], s4[4], s2[2];
    for (int i = 0; i < 8; i++) s8[i] = x.v[i] + x.v[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    for (int i = 0; i < 2; i++) s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
}

#define SUFFIX s
#define lanes lanes_s
#define lanes_zero zero_s
#define lanes_load(at) load_s(at, LANES)
#define lanes_load_part load_s
#define lanes_fma fma_s
#define lanes_sum sum_s
#define lanes_splat splat_s
#define lanes_store(at, x) store_s(at, x, LANES)
#define lanes_store_part store_s
#define ROW_TILE 2
#define OUT_TILE 2
#include "row_gemm_kernels.h" /* undefines the parameters above */

#if defined(__x86_64__) && defined(__GNUC__)
#define X86_WIDTHS 1
#include <immintrin.h>

/* ---- two AVX2 vectors: lanes 0-7 and 8-15 ---- */
#pragma GCC push_options
#pragma GCC target("avx2,fma")
typedef struct {
    __m256 low, high;
} lanes_v8;

INLINE lanes_v8 zero_v8(void) { return (lanes_v8){_mm256_setzero_ps(), _mm256_setzero_ps()}; }

INLINE lanes_v8 load_v8(const float *at) {
    return (lanes_v8){_mm256_loadu_ps(at), _mm256_loadu_ps(at + 8)};
}

INLINE lanes_v8 load_part_v8(const float *at, int64_t count) {
    float padded[LANES] = {0};
    memcpy(padded, at, (size_t)count * sizeof(float));
    return load_v8(padded);
}

INLINE lanes_v8 fma_v8(lanes_v8 a, lanes_v8 b, lanes_v8 acc) {
    return (lanes_v8){_mm256_fmadd_ps(a.low, b.low, acc.low),
                      _mm256_fmadd_ps(a.high, b.high, acc.high)};
}

INLINE lanes_v8 splat_v8(float value) {
    return (lanes_v8){_mm256_set1_ps(value), _mm256_set1_ps(value)};
}

INLINE void store_v8(float *at, lanes_v8 x) {
    _mm256_storeu_ps(at, x.low);
    _mm256_storeu_ps(at + 8, x.high);
}

INLINE void store_part_v8(float *at, lanes_v8 x, int64_t count) {
    float padded[LANES];
    store_v8(padded, x);
    memcpy(at, padded, (size_t)count * sizeof(float));
}

INLINE float sum_eight(__m256 s8) {
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    return _mm_cvtss_f32(s1);
}

INLINE float sum_v8(lanes_v8 x) { return sum_eight(_mm256_add_ps(x.low, x.high)); }

#define SUFFIX v8
#define lanes lanes_v8
#define lanes_zero zero_v8
#define lanes_load load_v8
#define lanes_load_part load_part_v8
#define lanes_fma fma_v8
#define lanes_sum sum_v8
#define lanes_splat splat_v8
#define lanes_store store_v8
#define lanes_store_part store_part_v8
#define ROW_TILE 2
#define OUT_TILE 3
#include "row_gemm_kernels.h" /* undefines the parameters above */
#pragma GCC pop_options

/* ---- one AVX-512 vector ---- */
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
INLINE __m512 load_part_v16(const float *at, int64_t count) {
    return _mm512_maskz_loadu_ps((__mmask16)((1u << count) - 1u), at);
}

INLINE void store_part_v16(float *at, __m512 x, int64_t count) {
    _mm512_mask_storeu_ps(at, (__mmask16)((1u << count) - 1u), x);
}

INLINE float sum_v16(__m512 x) {
    __m256 low = _mm512_castps512_ps256(x);
    __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1));
    return sum_eight(_mm256_add_ps(low, high));
}

#define SUFFIX v16
#define lanes __m512
#define lanes_zero _mm512_setzero_ps
#define lanes_load _mm512_loadu_ps
#define lanes_load_part load_part_v16
#define lanes_fma _mm512_fmadd_ps
#define lanes_sum sum_v16
#define lanes_splat _mm512_set1_ps
#define lanes_store _mm512_storeu_ps
#define lanes_store_part store_part_v16
#define ROW_TILE 4
#define OUT_TILE 6
#include "row_gemm_kernels.h" /* undefines the parameters above */
#pragma GCC pop_options
#endif

static int chosen_width; /* 0 until first use */

static int widest(void) {
#ifdef X86_WIDTHS
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma"))
        return 16;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 8;
#endif
    return 1;
}

/* The vector width in FP32 lanes: `wanted` (1, 8 or 16) when the CPU runs it, else the widest
 * it runs; 0 asks without changing. Tests use it to check that every width gives the same bits. */
EXPORT int helios_gemm_width(int wanted) {
    return pick_width(wanted, 1, widest(), &chosen_width);
}

/* out [count, out_stride] (outputs [first, stop) of each row) = rows [count, inner] (row
 * starts `row_stride` floats apart) times weight [outputs, inner] (starts `weight_stride`
 * apart) transposed, plus bias [outputs] unless it is NULL. Returns 0. */
EXPORT int helios_rows_times_weight(const float *rows, int64_t count, int64_t inner,
                                    int64_t row_stride, const float *weight, int64_t weight_stride,
                                    const float *bias, int64_t first, int64_t stop, float *out,
                                    int64_t out_stride) {
    int width = chosen_width ? chosen_width : helios_gemm_width(0);
#ifdef X86_WIDTHS
    if (width == 16) {
        rows_times_weight_v16(rows, count, inner, row_stride, weight, weight_stride, bias, first,
                              stop, out, out_stride);
        return 0;
    }
    if (width == 8) {
        rows_times_weight_v8(rows, count, inner, row_stride, weight, weight_stride, bias, first,
                             stop, out, out_stride);
        return 0;
    }
#endif
    (void)width;
    rows_times_weight_s(rows, count, inner, row_stride, weight, weight_stride, bias, first, stop,
                        out, out_stride);
    return 0;
}

/* Batch-invariant attention (invariant.blocked_attention's contract) of units [first, stop) of
 * count x heads (unit = sequence * heads + head): queries [count, heads, rows, dim] and out
 * [count, heads, rows, dim] contiguous; caches [slots, heads, dim] contiguous; key position j of
 * sequence s at cache row kv_slots[s * width + j]; mask bytes (nonzero: visible) of query row r
 * at mask[s * mask_sequence + r * mask_row + j * mask_key]. A query's scores are the kernel's
 * fixed-order dot products times `scale`; its maximum over visible keys is exact; the visible
 * keys' weights expf(score - max) and their products with the values are added in increasing
 * key position, one fused multiply-add per value lane; the sum divides last. Keys it cannot
 * see change nothing, so neither its chunk, its neighbours nor the padding does. A row that
 * sees no key gets zeros. Returns 0, or 1 when scratch memory is short. */
EXPORT int helios_invariant_attention(const float *queries, int64_t heads, int64_t rows,
                                      int64_t dim, const float *keys, const float *values,
                                      const int64_t *kv_slots, int64_t width, const uint8_t *mask,
                                      int64_t mask_sequence, int64_t mask_row, int64_t mask_key,
                                      float scale, int64_t first, int64_t stop, float *out) {
    float *scores = malloc((size_t)(width > 0 ? width : 1) * 4 * sizeof(float));
    if (!scores) return 1;
    int width_ = chosen_width ? chosen_width : helios_gemm_width(0);
#ifdef X86_WIDTHS
    if (width_ == 16)
        attend_v16(queries, heads, rows, dim, keys, values, kv_slots, width, mask, mask_sequence,
                   mask_row, mask_key, scale, first, stop, out, scores);
    else if (width_ == 8)
        attend_v8(queries, heads, rows, dim, keys, values, kv_slots, width, mask, mask_sequence,
                  mask_row, mask_key, scale, first, stop, out, scores);
    else
#endif
        attend_s(queries, heads, rows, dim, keys, values, kv_slots, width, mask, mask_sequence,
                 mask_row, mask_key, scale, first, stop, out, scores);
    free(scores);
    return 0;
}
