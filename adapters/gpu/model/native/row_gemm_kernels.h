/* row_gemm.c's kernel at one lane representation: row_gemm.c includes this file once per width,
 * defining SUFFIX (appended to every name here), `lanes` (16 FP32 lanes) with lanes_zero,
 * lanes_load, lanes_load_part (the first n lanes, the rest zero), lanes_fma and lanes_sum (the
 * fixed lane tree), and ROW_TILE x OUT_TILE, the dot products kept in registers at once. Tiles
 * change which products run side by side, never an operation of one product or its order.
 * It undefines all of them at its end, so each width's block defines only its own.
 */

#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define tile CAT(tile, SUFFIX)
#define tile_rows CAT(tile_rows, SUFFIX)
#define rows_times_weight CAT(rows_times_weight, SUFFIX)
#define attend CAT(attend, SUFFIX)

/* The dot products [rt][OUT_TILE] of rows `row` [rt] with weight rows `w` [OUT_TILE]. */
INLINE void tile(const float *const *row, const int rt, const float *const *w, int64_t inner,
                 float sums[ROW_TILE][OUT_TILE]) {
    lanes acc[ROW_TILE][OUT_TILE];
#pragma GCC unroll 8
    for (int r = 0; r < rt; r++)
#pragma GCC unroll 8
        for (int o = 0; o < OUT_TILE; o++) acc[r][o] = lanes_zero();
    int64_t k = 0;
    for (; k + LANES <= inner; k += LANES) {
        lanes x[ROW_TILE];
#pragma GCC unroll 8
        for (int r = 0; r < rt; r++) x[r] = lanes_load(row[r] + k);
#pragma GCC unroll 8
        for (int o = 0; o < OUT_TILE; o++) {
            lanes wo = lanes_load(w[o] + k);
#pragma GCC unroll 8
            for (int r = 0; r < rt; r++) acc[r][o] = lanes_fma(x[r], wo, acc[r][o]);
        }
    }
    if (k < inner) {
        lanes x[ROW_TILE];
#pragma GCC unroll 8
        for (int r = 0; r < rt; r++) x[r] = lanes_load_part(row[r] + k, inner - k);
#pragma GCC unroll 8
        for (int o = 0; o < OUT_TILE; o++) {
            lanes wo = lanes_load_part(w[o] + k, inner - k);
#pragma GCC unroll 8
            for (int r = 0; r < rt; r++) acc[r][o] = lanes_fma(x[r], wo, acc[r][o]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < rt; r++)
#pragma GCC unroll 8
        for (int o = 0; o < OUT_TILE; o++) sums[r][o] = lanes_sum(acc[r][o]);
}

/* `tile` with its row count a constant, so each count gets its own registers. */
static void tile_rows(const float *const *row, int rt, const float *const *w, int64_t inner,
                      float sums[ROW_TILE][OUT_TILE]) {
    switch (rt) {
#if ROW_TILE >= 4
    case 4:
        tile(row, 4, w, inner, sums);
        break;
#endif
#if ROW_TILE >= 3
    case 3:
        tile(row, 3, w, inner, sums);
        break;
#endif
#if ROW_TILE >= 2
    case 2:
        tile(row, 2, w, inner, sums);
        break;
#endif
    default:
        tile(row, 1, w, inner, sums);
    }
}

static void rows_times_weight(const float *rows, int64_t count, int64_t inner, int64_t row_stride,
                              const float *weight, int64_t weight_stride, const float *bias,
                              int64_t first, int64_t stop, float *out, int64_t out_stride) {
    for (int64_t block = 0; block < count; block += BLOCK_ROWS) {
        int64_t block_stop = count < block + BLOCK_ROWS ? count : block + BLOCK_ROWS;
        for (int64_t o0 = first; o0 < stop; o0 += OUT_TILE) {
            const float *w[OUT_TILE];
            /* Outputs past `stop` repeat the last one; their sums are not stored. */
            for (int o = 0; o < OUT_TILE; o++)
                w[o] = weight + (o0 + o < stop ? o0 + o : stop - 1) * weight_stride;
            for (int64_t r0 = block; r0 < block_stop; r0 += ROW_TILE) {
                int rt = block_stop - r0 < ROW_TILE ? (int)(block_stop - r0) : ROW_TILE;
                const float *row[ROW_TILE];
                for (int r = 0; r < rt; r++) row[r] = rows + (r0 + r) * row_stride;
                float sums[ROW_TILE][OUT_TILE];
                tile_rows(row, rt, w, inner, sums);
                for (int r = 0; r < rt; r++) {
                    float *target = out + (r0 + r) * out_stride + o0;
                    for (int o = 0; o < OUT_TILE && o0 + o < stop; o++)
                        target[o] = bias ? sums[r][o] + bias[o0 + o] : sums[r][o];
                }
            }
        }
    }
}

/* helios_invariant_attention at this width; `scores` holds 4 x width floats. */
static void attend(const float *queries, int64_t heads, int64_t rows, int64_t dim,
                   const float *keys, const float *values, const int64_t *kv_slots, int64_t width,
                   const uint8_t *mask, int64_t mask_sequence, int64_t mask_row, int64_t mask_key,
                   float scale, int64_t first, int64_t stop, float *out, float *scores) {
    for (int64_t unit = first; unit < stop; unit++) {
        int64_t sequence = unit / heads, head = unit % heads;
        const int64_t *slot = kv_slots + sequence * width;
        for (int64_t r0 = 0; r0 < rows; r0 += ROW_TILE) {
            int rt = rows - r0 < ROW_TILE ? (int)(rows - r0) : ROW_TILE;
            const float *query[ROW_TILE];
            const uint8_t *visible[ROW_TILE];
            int64_t end = 0; /* past the last key any of these rows sees */
            for (int r = 0; r < rt; r++) {
                query[r] = queries + (unit * rows + r0 + r) * dim;
                visible[r] = mask + sequence * mask_sequence + (r0 + r) * mask_row;
                for (int64_t j = width; j > end; j--) {
                    if (visible[r][(j - 1) * mask_key]) {
                        end = j;
                        break;
                    }
                }
            }
            for (int64_t j0 = 0; j0 < end; j0 += OUT_TILE) {
                const float *key[OUT_TILE];
                for (int o = 0; o < OUT_TILE; o++) {
                    int64_t j = j0 + o < end ? j0 + o : end - 1;
                    key[o] = keys + (slot[j] * heads + head) * dim;
                }
                float sums[ROW_TILE][OUT_TILE];
                tile_rows(query, rt, key, dim, sums);
                for (int r = 0; r < rt; r++)
                    for (int o = 0; o < OUT_TILE && j0 + o < end; o++)
                        scores[r * width + j0 + o] = sums[r][o] * scale;
            }
            for (int r = 0; r < rt; r++) {
                float *target = out + (unit * rows + r0 + r) * dim;
                const float *score = scores + r * width;
                float top = -INFINITY;
                for (int64_t j = 0; j < end; j++)
                    if (visible[r][j * mask_key] && score[j] > top) top = score[j];
                memset(target, 0, (size_t)dim * sizeof(float));
                float total = 0.0f;
                for (int64_t j = 0; j < end; j++) {
                    if (!visible[r][j * mask_key]) continue;
                    float weight = expf(score[j] - top);
                    total += weight;
                    const float *value = values + (slot[j] * heads + head) * dim;
                    lanes spread = lanes_splat(weight);
                    int64_t d = 0;
                    for (; d + LANES <= dim; d += LANES)
                        lanes_store(target + d,
                                    lanes_fma(spread, lanes_load(value + d), lanes_load(target + d)));
                    if (d < dim) {
                        lanes sum = lanes_fma(spread, lanes_load_part(value + d, dim - d),
                                              lanes_load_part(target + d, dim - d));
                        lanes_store_part(target + d, sum, dim - d);
                    }
                }
                if (total > 0.0f)
                    for (int64_t d = 0; d < dim; d++) target[d] = target[d] / total;
            }
        }
    }
}

#undef tile
#undef tile_rows
#undef rows_times_weight
#undef attend
#undef SUFFIX
#undef lanes
#undef lanes_zero
#undef lanes_load
#undef lanes_load_part
#undef lanes_fma
#undef lanes_sum
#undef lanes_splat
#undef lanes_store
#undef lanes_store_part
#undef ROW_TILE
#undef OUT_TILE
