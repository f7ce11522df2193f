/* The exact FP32 logprob reduction on the CPU: normalizer.py's torch recipe, fused per tile.
 *
 * Every kernel repeats the reference operation for operation: per-tile maxima, exp from FP32
 * multiplies and adds (Horner, one rounding per step), a pairwise tree over each tile of
 * LSE_TILE lanes, tiles combined in order, log from FP32 multiplies and adds. Only the number
 * of passes over memory changes, so the bits are those of the torch recipe and of the Triton
 * kernel. `make` builds it with -O2 -ffp-contract=off -fno-fast-math: a contracted multiply-add
 * rounds once where the reference rounds twice, and fast math would reorder the sums.
 *
 * Vectors are GCC vector extensions, whose operations are elementwise IEEE FP32. The kernels
 * (reduction_kernels.h) are compiled at three widths on x86-64, 16 lanes for AVX-512, 8 for
 * AVX2 and 4 for the baseline, and the widest the CPU runs is chosen on first use.
 *
 * Entry points return 0, or 1 where the torch recipe must decide instead: a NaN input, or a
 * maximum that is a zero of both signs (torch's amax picks one by its own lane order).
 */
#include "../../native_width.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

#define TILE 1024     /* normalizer.LSE_TILE */
#define MAX_TILES 1024 /* the widest row helios_log_normalizer takes, in tiles */
#define MAX_TOP 64    /* the most sort keys helios_top_keys keeps */
#define BLOCK 64      /* lanes helios_top_keys screens at once */

#define INLINE static inline __attribute__((always_inline))
#define EXPORT __attribute__((visibility("default")))

/* normalizer.py's constants, rounded to FP32 as torch rounds a scalar operand; the bit tests
 * (tests/integration/torch/test_native_reduction.py) fail if the two copies drift apart. */
#define EXP_LOW (-86.0f)
#define EXP_HIGH 88.0f
#define LOG2E ((float)1.4426950408889634)
#define LN2_HIGH ((float)0.693359375)
#define LN2_LOW ((float)-2.12194440e-4)
#define SQRT_HALF ((float)0.70710677)
static const float EXP_C[6] = {
    (float)1.9875691500e-4, (float)1.3981999507e-3, (float)8.3334519073e-3,
    (float)4.1665795894e-2, (float)1.6666665459e-1, (float)5.0000001201e-1,
};
static const float LOG_C[9] = {
    (float)7.0376836292e-2,  (float)-1.1514610310e-1, (float)1.1676998740e-1,
    (float)-1.2420140846e-1, (float)1.4249322787e-1,  (float)-1.6668057665e-1,
    (float)2.0000714765e-1,  (float)-2.4999993993e-1, (float)3.3333331174e-1,
};

INLINE float finite_or_zero(float peak) { return isinf(peak) ? 0.0f : peak; }

/* Whether a zero maximum of `values` could be +0.0 or -0.0 (both are present). */
static int mixed_zeros(const float *values, int64_t count) {
    int positive = 0, negative = 0;
    for (int64_t i = 0; i < count; i++) {
        if (values[i] == 0.0f) {
            if (signbit(values[i])) negative = 1;
            else positive = 1;
        }
    }
    return positive && negative;
}

/* keys.order_keys of one value and its ID. */
INLINE int64_t order_key(float value, int64_t id) {
    int32_t bits;
    memcpy(&bits, &value, sizeof bits);
    int32_t ordered = bits >= 0 ? bits : bits ^ 0x7FFFFFFF;
    if (bits == INT32_MIN) ordered = 0; /* -0.0 ranks as +0.0 */
    return (int64_t)ordered * ((int64_t)1 << 32) + (0xFFFFFFFFLL - id);
}

/* Puts `key` into the descending `keys` [k] (its value into `values`), dropping the last. */
INLINE void insert_key(int64_t *keys, float *values, int64_t k, int64_t key, float value) {
    int64_t at = k - 1;
    while (at > 0 && keys[at - 1] < key) {
        keys[at] = keys[at - 1];
        values[at] = values[at - 1];
        at--;
    }
    keys[at] = key;
    values[at] = value;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define X86_WIDTHS 1

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
#define WIDTH 16
#define SUFFIX w16
#define EVEN_LANES {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}
#define ODD_LANES {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31}
#include "reduction_kernels.h"
#undef WIDTH
#undef SUFFIX
#undef EVEN_LANES
#undef ODD_LANES
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2")
#define WIDTH 8
#define SUFFIX w8
#define EVEN_LANES {0, 2, 4, 6, 8, 10, 12, 14}
#define ODD_LANES {1, 3, 5, 7, 9, 11, 13, 15}
#include "reduction_kernels.h"
#undef WIDTH
#undef SUFFIX
#undef EVEN_LANES
#undef ODD_LANES
#pragma GCC pop_options
#endif

#define WIDTH 4
#define SUFFIX w4
#define EVEN_LANES {0, 2, 4, 6}
#define ODD_LANES {1, 3, 5, 7}
#include "reduction_kernels.h"
#undef WIDTH
#undef SUFFIX
#undef EVEN_LANES
#undef ODD_LANES

static int chosen_width; /* 0 until first use */

static int widest(void) {
#ifdef X86_WIDTHS
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2"))
        return 16;
    if (__builtin_cpu_supports("avx2")) return 8;
#endif
    return 4;
}

/* The kernels' vector width: `wanted` (4, 8 or 16) when the CPU runs it, else the widest it
 * runs; 0 asks without changing. Tests use it to check every width the CPU has. */
EXPORT int helios_vector_width(int wanted) {
    return pick_width(wanted, 4, widest(), &chosen_width);
}

static int width(void) { return chosen_width ? chosen_width : helios_vector_width(0); }

#ifdef X86_WIDTHS
#define DISPATCH(name, ...)                                      \
    (width() == 16  ? name##_w16(__VA_ARGS__)                   \
     : width() == 8 ? name##_w8(__VA_ARGS__)                    \
                    : name##_w4(__VA_ARGS__))
#else
#define DISPATCH(name, ...) name##_w4(__VA_ARGS__)
#endif

/* normalizer.tile_statistics: peaks and masses [count, ceil(vocab / TILE)] of rows [count,
 * vocab] whose starts are `stride` floats apart. */
EXPORT int helios_tile_statistics(const float *rows, int64_t count, int64_t vocab, int64_t stride,
                                  float *peaks, float *masses) {
    return DISPATCH(tile_statistics, rows, count, vocab, stride, peaks, masses);
}

/* normalizer.combine_tiles: the log normalizer [count] of statistics [count, tiles]. */
EXPORT int helios_combine_tiles(const float *peaks, const float *masses, int64_t count,
                                int64_t tiles, float *normalizers) {
    return DISPATCH(combine_tiles, peaks, masses, count, tiles, normalizers);
}

/* normalizer.log_normalizer of rows [count, vocab], vocab <= MAX_TILES * TILE. */
EXPORT int helios_log_normalizer(const float *rows, int64_t count, int64_t vocab, int64_t stride,
                                 float *normalizers) {
    return DISPATCH(log_normalizer, rows, count, vocab, stride, normalizers);
}

/* keys.top_sort_keys: the k largest sort keys [count, k] of each row, descending. */
EXPORT int helios_top_keys(const float *rows, int64_t count, int64_t width_, int64_t stride,
                           int64_t k, int64_t *keys) {
    if (k < 1 || k > MAX_TOP || k > width_) return 1;
    return DISPATCH(top_keys, rows, count, width_, stride, NULL, k, keys);
}

/* helios_top_keys of the values rows - shifts[row], which it never writes: the reported
 * logprobs' keys straight from the logits and their normalizers. */
EXPORT int helios_top_keys_shifted(const float *rows, int64_t count, int64_t width_,
                                   int64_t stride, const float *shifts, int64_t k,
                                   int64_t *keys) {
    if (k < 1 || k > MAX_TOP || k > width_) return 1;
    return DISPATCH(top_keys, rows, count, width_, stride, shifts, k, keys);
}

/* How many lanes of each row exceed its pivot (NaN never does), as (values > pivot).sum(1). */
EXPORT void helios_count_greater(const float *rows, int64_t count, int64_t width_,
                                 int64_t stride, const float *pivots, int32_t *counts) {
    DISPATCH(count_greater, rows, count, width_, stride, pivots, counts);
}
