/* The reduction's kernels at one vector width: reduction.c includes this file once per width,
 * defining WIDTH (FP32 lanes of a vector), SUFFIX (appended to every name defined here) and
 * EVEN_LANES / ODD_LANES (the even and odd lane indices of two concatenated vectors).
 *
 * A vector is as wide as the instructions the including target enables: GCC breaks a wider
 * vector's comparisons into scalar code. Widths change the schedule, never an FP32 operation
 * or its order, so every width gives the same bits.
 */

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define vf CAT(vf, SUFFIX)
#define vi CAT(vi, SUFFIX)
#define splat CAT(splat, SUFFIX)
#define load CAT(load, SUFFIX)
#define store CAT(store, SUFFIX)
#define load_part CAT(load_part, SUFFIX)
#define pick CAT(pick, SUFFIX)
#define any CAT(any, SUFFIX)
#define floor_small CAT(floor_small, SUFFIX)
#define fp32_exp CAT(fp32_exp, SUFFIX)
#define exp_steps CAT(exp_steps, SUFFIX)
#define fp32_exp_nonpositive CAT(fp32_exp_nonpositive, SUFFIX)
#define fp32_log CAT(fp32_log, SUFFIX)
#define tile_statistic CAT(tile_statistic, SUFFIX)
#define combine_row CAT(combine_row, SUFFIX)
#define take_lanes CAT(take_lanes, SUFFIX)

typedef float vf __attribute__((vector_size(WIDTH * 4)));
typedef int32_t vi __attribute__((vector_size(WIDTH * 4)));

INLINE vf splat(float value) { return (vf){0} + value; }

INLINE vf load(const float *at) {
    vf v;
    memcpy(&v, at, sizeof v);
    return v;
}

INLINE void store(float *at, vf v) { memcpy(at, &v, sizeof v); }

/* `count` < WIDTH lanes from `at`, the rest `fill`. */
INLINE vf load_part(const float *at, int64_t count, float fill) {
    vf v = splat(fill);
    for (int64_t i = 0; i < count; i++) v[i] = at[i];
    return v;
}

INLINE vf pick(vi mask, vf yes, vf no) { return (vf)((mask & (vi)yes) | (~mask & (vi)no)); }

INLINE int any(vi mask) {
    uint64_t words[WIDTH / 2], folded = 0;
    memcpy(words, &mask, sizeof words);
    for (int i = 0; i < WIDTH / 2; i++) folded |= words[i];
    return folded != 0;
}

/* floor of values within int32 range, from a truncating conversion. */
INLINE vf floor_small(vf x) {
    vf t = __builtin_convertvector(__builtin_convertvector(x, vi), vf);
    return pick(t > x, t - 1.0f, t);
}

/* The polynomial steps of normalizer.fp32_exp for `finite` already in [EXP_LOW, EXP_HIGH]. */
INLINE vf exp_steps(vf finite) {
    vf n = finite * LOG2E;
    n = floor_small(n + 0.5f);
    vf r = finite - n * LN2_HIGH;
    r = r - n * LN2_LOW;
    vf poly = splat(EXP_C[0]);
    for (int i = 1; i < 6; i++) {
        poly = poly * r;
        poly = poly + EXP_C[i];
    }
    poly = poly * (r * r);
    poly = poly + r;
    poly = poly + 1.0f;
    vi exponent = (__builtin_convertvector(n, vi) + 127) * (1 << 23);
    return poly * (vf)exponent;
}

/* normalizer.fp32_exp, step for step. */
INLINE vf fp32_exp(vf x) {
    vi nan = x != x;
    vf finite = pick(nan, splat(0.0f), x);
    finite = pick(finite < EXP_LOW, splat(EXP_LOW), finite);
    finite = pick(finite > EXP_HIGH, splat(EXP_HIGH), finite);
    vf result = exp_steps(finite);
    result = pick(x < EXP_LOW, splat(0.0f), result);
    result = pick(x > EXP_HIGH, splat(INFINITY), result);
    return pick(nan, x, result);
}

/* fp32_exp of x <= 0 (-inf included): no NaN, no upper clamp and no overflow to mask, so the
 * same bits from fewer operations. */
INLINE vf fp32_exp_nonpositive(vf x) {
    vi low = x < EXP_LOW;
    return pick(low, splat(0.0f), exp_steps(pick(low, splat(EXP_LOW), x)));
}

/* normalizer.fp32_log, step for step. */
INLINE vf fp32_log(vf s) {
    vi finite = (s == s) & (s != INFINITY) & (s != -INFINITY);
    vf normal = pick(finite & (s > 0.0f), s, splat(1.0f));
    vi bits = (vi)normal;
    vi exponent_bits = (bits >> 23) - 126;
    vf mantissa = (vf)((bits & 0x007FFFFF) | 0x3F000000);
    vi small = mantissa < SQRT_HALF; /* -1 where true, so adding it subtracts one */
    vf exponent = __builtin_convertvector(exponent_bits + small, vf);
    vf f = pick(small, (mantissa + mantissa) - 1.0f, mantissa - 1.0f);
    vf z = f * f;
    vf poly = splat(LOG_C[0]);
    for (int i = 1; i < 9; i++) {
        poly = poly * f;
        poly = poly + LOG_C[i];
    }
    vf y = (poly * f) * z;
    y = y + exponent * LN2_LOW;
    y = y + z * -0.5f;
    vf result = (f + y) + exponent * LN2_HIGH;
    result = pick(s == 0.0f, splat(-INFINITY), result);
    return pick(finite & (s >= 0.0f), result, s);
}

/* One tile's maximum and pairwise exponential mass (`lanes` <= TILE, the rest -inf). */
INLINE int tile_statistic(const float *x, int64_t lanes, float *peak_out, float *mass_out) {
    float tree[TILE] __attribute__((aligned(64)));
    int64_t whole = lanes / WIDTH * WIDTH;
    vf top = splat(-INFINITY);
    vi nan = {0};
    for (int64_t i = 0; i < whole; i += WIDTH) {
        vf v = load(x + i);
        nan |= v != v;
        top = pick(v > top, v, top);
    }
    vf tail = load_part(x + whole, lanes - whole, -INFINITY);
    nan |= tail != tail;
    top = pick(tail > top, tail, top);
    if (any(nan)) return 1;
    float peak = top[0];
    for (int i = 1; i < WIDTH; i++) peak = top[i] > peak ? top[i] : peak;
    if (peak == 0.0f && mixed_zeros(x, lanes)) return 1;
    float shift = finite_or_zero(peak);
    if (shift == peak) { /* a finite maximum: every x - shift is <= 0 */
        for (int64_t i = 0; i < whole; i += WIDTH)
            store(tree + i, fp32_exp_nonpositive(load(x + i) - shift));
    } else {
        for (int64_t i = 0; i < whole; i += WIDTH) store(tree + i, fp32_exp(load(x + i) - shift));
    }
    int64_t filled = whole;
    if (lanes > whole) {
        store(tree + whole, fp32_exp(tail - shift));
        filled += WIDTH;
    }
    /* A padded lane is exp(-inf - shift) = +0.0 in the reference. */
    for (int64_t i = filled; i < TILE; i += WIDTH) store(tree + i, splat(0.0f));
    /* The tree: neighbours (2i, 2i+1) add at every level, in place from the front. */
    const vi even = EVEN_LANES, odd = ODD_LANES;
    for (int width = TILE / 2; width >= WIDTH; width /= 2) {
        for (int i = 0; i < width; i += WIDTH) {
            vf a = load(tree + 2 * i), b = load(tree + 2 * i + WIDTH);
            store(tree + i, __builtin_shuffle(a, b, even) + __builtin_shuffle(a, b, odd));
        }
    }
    for (int width = WIDTH / 2; width >= 1; width /= 2)
        for (int i = 0; i < width; i++) tree[i] = tree[2 * i] + tree[2 * i + 1];
    *peak_out = peak;
    *mass_out = tree[0];
    return 0;
}

/* normalizer.combine_tiles of one row's `tiles` statistics. */
INLINE int combine_row(const float *peak, const float *mass, int64_t tiles, float *normalizer) {
    float top = -INFINITY;
    for (int64_t t = 0; t < tiles; t++) {
        if (peak[t] != peak[t] || mass[t] != mass[t]) return 1;
        top = peak[t] > top ? peak[t] : top;
    }
    if (top == 0.0f && mixed_zeros(peak, tiles)) return 1;
    float shift = finite_or_zero(top);
    float total = 0.0f;
    for (int64_t t = 0; t < tiles; t += WIDTH) {
        int64_t part = tiles - t < WIDTH ? tiles - t : WIDTH;
        vf offsets = splat(0.0f);
        for (int64_t i = 0; i < part; i++) offsets[i] = finite_or_zero(peak[t + i]);
        vf factors = fp32_exp(offsets - shift);
        for (int64_t i = 0; i < part; i++) {
            /* An all -inf tile holds no mass; its factor may overflow, so it is dropped. */
            float rescaled = peak[t + i] == -INFINITY ? 0.0f : mass[t + i] * factors[i];
            total = total + rescaled;
        }
    }
    *normalizer = shift + fp32_log(splat(total))[0];
    return 0;
}

static int CAT(tile_statistics, SUFFIX)(const float *rows, int64_t count, int64_t vocab,
                                        int64_t stride, float *peaks, float *masses) {
    int64_t tiles = (vocab + TILE - 1) / TILE;
    for (int64_t row = 0; row < count; row++) {
        for (int64_t tile = 0; tile < tiles; tile++) {
            int64_t start = tile * TILE;
            int64_t lanes = vocab - start < TILE ? vocab - start : TILE;
            int64_t at = row * tiles + tile;
            if (tile_statistic(rows + row * stride + start, lanes, peaks + at, masses + at))
                return 1;
        }
    }
    return 0;
}

static int CAT(combine_tiles, SUFFIX)(const float *peaks, const float *masses, int64_t count,
                                      int64_t tiles, float *normalizers) {
    for (int64_t row = 0; row < count; row++) {
        int64_t at = row * tiles;
        if (combine_row(peaks + at, masses + at, tiles, normalizers + row)) return 1;
    }
    return 0;
}

static int CAT(log_normalizer, SUFFIX)(const float *rows, int64_t count, int64_t vocab,
                                       int64_t stride, float *normalizers) {
    int64_t tiles = (vocab + TILE - 1) / TILE;
    if (tiles > MAX_TILES) return 1;
    float peaks[MAX_TILES], masses[MAX_TILES];
    for (int64_t row = 0; row < count; row++) {
        if (CAT(tile_statistics, SUFFIX)(rows + row * stride, 1, vocab, stride, peaks, masses))
            return 1;
        if (combine_row(peaks, masses, tiles, normalizers + row)) return 1;
    }
    return 0;
}

/* Offers the values x[i] - shift of lanes [begin, end) to the kept keys; 1 on a NaN. */
INLINE int take_lanes(const float *x, float shift, int64_t begin, int64_t end, int64_t *keys,
                      float *kept, int64_t k, float *floor_value) {
    for (int64_t i = begin; i < end; i++) {
        float value = x[i] - shift;
        if (value != value) return 1;
        if (value > *floor_value) {
            insert_key(keys, kept, k, order_key(value, i), value);
            *floor_value = kept[k - 1];
        }
    }
    return 0;
}

/* keys.top_sort_keys of the values rows - shifts[row] (FP32 subtractions; no shifts: the rows
 * themselves): the k (<= MAX_TOP, <= width) largest sort keys of each row, descending.
 *
 * Lanes are offered in ID order, so a lane whose value only equals the k-th kept value has a
 * larger ID and so a smaller key: only strictly greater values can enter. Blocks of BLOCK
 * lanes are screened with one test; only a block that may hold a NaN or an entrant is read
 * again lane by lane. Subtracting +0.0 changes no value, -0.0 included.
 */
static int CAT(top_keys, SUFFIX)(const float *rows, int64_t count, int64_t width,
                                 int64_t stride, const float *shifts, int64_t k,
                                 int64_t *keys_out) {
    for (int64_t row = 0; row < count; row++) {
        const float *x = rows + row * stride;
        float shift = shifts ? shifts[row] : 0.0f;
        int64_t keys[MAX_TOP];
        float kept[MAX_TOP];
        for (int64_t i = 0; i < k; i++) {
            float value = x[i] - shift;
            if (value != value) return 1;
            keys[i] = INT64_MIN;
            insert_key(keys, kept, i + 1, order_key(value, i), value);
        }
        float floor_value = kept[k - 1];
        vf shift_lanes = splat(shift);
        int64_t lane = k;
        for (; lane + BLOCK <= width; lane += BLOCK) {
            vi hits = {0};
            for (int64_t i = lane; i < lane + BLOCK; i += WIDTH)
                hits |= ~(load(x + i) - shift_lanes <= floor_value); /* greater, or NaN */
            if (any(hits) &&
                take_lanes(x, shift, lane, lane + BLOCK, keys, kept, k, &floor_value))
                return 1;
        }
        if (take_lanes(x, shift, lane, width, keys, kept, k, &floor_value)) return 1;
        memcpy(keys_out + row * k, keys, k * sizeof *keys);
    }
    return 0;
}

static void CAT(count_greater, SUFFIX)(const float *rows, int64_t count, int64_t width,
                                       int64_t stride, const float *pivots, int32_t *counts) {
    for (int64_t row = 0; row < count; row++) {
        const float *x = rows + row * stride;
        float pivot = pivots[row];
        vi tally = {0};
        int64_t lane = 0;
        for (; lane + WIDTH <= width; lane += WIDTH) tally -= load(x + lane) > pivot;
        int32_t total = 0;
        for (int i = 0; i < WIDTH; i++) total += tally[i];
        for (; lane < width; lane++) total += x[lane] > pivot;
        counts[row] = total;
    }
}

#undef vf
#undef vi
#undef splat
#undef load
#undef store
#undef load_part
#undef pick
#undef any
#undef floor_small
#undef fp32_exp
#undef exp_steps
#undef fp32_exp_nonpositive
#undef fp32_log
#undef tile_statistic
#undef combine_row
#undef take_lanes
#undef CAT
#undef CAT_
