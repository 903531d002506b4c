/* Chapter 9's CPU prompt attention: a step's prompts (and chunks of prompts) attend causally to their
   paged context, the way a flash kernel does: tiles of keys, and a softmax kept online -- a running
   maximum and sum per query, the output so far rescaled whenever the maximum grows (chapter 5b's
   Triton kernel walks a sequence's keys the same way).

   Why a kernel of our own: PyTorch's CPU flash kernel (what the "torch" backend calls) takes keys in
   tiles of 512 and skips a tile only when no query of its tile can see it, so a prompt of a few
   hundred to a thousand tokens computes nearly all of the masked half of its scores too. Here a key
   tile is KEY_TILE keys and each tile of queries stops at its last visible key: about half the work
   for a whole prompt. Keys and values are read where they lie in the pool, through the block table
   (no gathered copy), and the query heads that share a KV head (GQA) attend together, so each key
   is read once for all of them.

   One work item: QUERY_TILE consecutive queries of one sequence for each of a KV head's query heads
   (its rows), walking the key tiles up to the position of its last query. Per key tile:
     scores = keys x rows, vectorised across rows: the rows' queries lie transposed ([head_dim][rows]),
              so a key's value at d, broadcast, multiplies a whole vec of rows;
     the mask on the diagonal tile only; the online softmax, also across rows;
     output += probabilities x values, vectorised along head_dim.
   OpenMP shares the items among PyTorch's threads, the sequences' last query tiles first (they see
   the most keys).

   `vec` is one register of floats: 16 with AVX-512, else 8 (an AVX2 register; two on a 128-bit CPU).
   The products are written on whole registers, a few keys or rows at a time, so the compiler keeps
   the running sums in registers rather than in memory, as many as the CPU has (see the blocks below).

   Shapes (float32): q [num_tokens, num_heads, head_dim] with its tokens q_stride floats apart (each
   token's heads together: q may be a view into the fused qkv matmul's output); out the same shape,
   contiguous. Sequence s's queries are rows query_start_loc[s] .. query_start_loc[s + 1], the last of
   its seq_lens[s] positions. k_cache and v_cache [num_blocks, block_size, num_kv_heads, head_dim];
   block_tables [num_seqs, max_blocks], seq_lens [num_seqs], query_start_loc [num_seqs + 1] int32;
   seq_ids [num_ids], the sequences to attend (a step's prompts and chunks; its decodes go to the
   decode kernel): only their rows of out are written. Returns 1 when a buffer cannot be allocated. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fast_exp.h"

#define KEY_TILE 64   /* keys per tile */
#define QUERY_TILE 16 /* queries per work item, per query head */
/* How many running sums stay in registers at once follows the registers the CPU has: AVX-512 has 32
   of 16 floats, AVX2 16 of 8. The AVX-512 sizes on an AVX2 CPU spill to memory: a 1,921-token step's
   prompts (SmolLM2's heads, one layer) took 112 ms there, 13 ms with these, 37 ms in PyTorch's SDPA. */
#if defined(__AVX512F__)
#define LANES 16
#define ROW_BLOCK 4 /* rows whose outputs stay in registers together */
#define KEY_BLOCK 8 /* keys whose scores stay in registers together */
#else
#define LANES 8
#define ROW_BLOCK 2
#define KEY_BLOCK 4
#endif
#define ROW_VECS 3 /* ... for up to this many vecs of rows */

typedef float vec __attribute__((vector_size(LANES * sizeof(float))));
typedef float vec_unaligned __attribute__((vector_size(LANES * sizeof(float)), aligned(4)));

typedef struct {
    int seq, kv_head, first_query, num_queries;
} work_item;

static const float *token_row(const float *cache, const int32_t *table, int t, int block_size, long row_size) {
    return cache + ((long)table[t / block_size] * block_size + t % block_size) * row_size;
}

/* scores[t][c * LANES : (c + width) * LANES] = keys t .. t + KEY_BLOCK dotted with the rows whose
   queries lie transposed in queries_t ([head_dim][rows]): each key's value at d is broadcast over
   `width` vecs of rows, KEY_BLOCK * width running sums in registers. */
static inline void score_keys(float *scores, const float *queries_t, const float *const *keys, int t, int c,
                              int width, int rows, int head_dim) {
    vec acc[KEY_BLOCK][ROW_VECS] = {{0}};
    for (int d = 0; d < head_dim; d++) {
        const vec *qd = (const vec *)(queries_t + (long)d * rows) + c;
        for (int i = 0; i < KEY_BLOCK; i++) {
            const float kd = keys[t + i][d];
            for (int j = 0; j < width; j++) acc[i][j] += kd * qd[j];
        }
    }
    for (int i = 0; i < KEY_BLOCK; i++)
        memcpy(scores + (long)(t + i) * rows + c * LANES, acc[i], sizeof(vec) * width);
}

/* acc[r .. r + ROW_BLOCK][d0 : d0 + width * LANES] += probs[0:n][r ..] x values[0:n][d0 : ...] */
static inline void weigh_values(float *acc, const float *probs, const float *const *values, int n, int r, int d0,
                                int width, int rows, int head_dim) {
    vec sum[ROW_BLOCK][4];
    for (int i = 0; i < ROW_BLOCK; i++) memcpy(sum[i], acc + (long)(r + i) * head_dim + d0, sizeof(vec) * width);
    for (int t = 0; t < n; t++) {
        const vec_unaligned *v = (const vec_unaligned *)(values[t] + d0);
        for (int i = 0; i < ROW_BLOCK; i++) {
            const float p = probs[(long)t * rows + r + i];
            for (int j = 0; j < width; j++) sum[i][j] += p * v[j];
        }
    }
    for (int i = 0; i < ROW_BLOCK; i++) memcpy(acc + (long)(r + i) * head_dim + d0, sum[i], sizeof(vec) * width);
}

/* every row's acc += probs x values: four vecs of head_dim at a time, then what is left one by one */
static void weigh_tile(float *acc, const float *probs, const float *const *values, int n, int rows, int head_dim) {
    const int whole = head_dim / LANES * LANES;
    for (int r = 0; r < rows; r += ROW_BLOCK)
        for (int d0 = 0; d0 < whole; d0 += 4 * LANES) {
            if (whole - d0 >= 4 * LANES) /* the usual case: a constant width the compiler unrolls */
                weigh_values(acc, probs, values, n, r, d0, 4, rows, head_dim);
            else
                weigh_values(acc, probs, values, n, r, d0, (whole - d0) / LANES, rows, head_dim);
        }
    for (int r = 0; r < rows; r++)
        for (int t = 0; t < n; t++)
            for (int d = whole; d < head_dim; d++) acc[(long)r * head_dim + d] += probs[(long)t * rows + r] * values[t][d];
}

/* each of a tile's scores computed for `width` vecs of rows at a time, a compile-time constant in each call */
static void score_tile(float *scores, const float *queries_t, const float *const *keys, int tile, int rows,
                       int head_dim) {
    for (int c = 0; c < rows / LANES; c += ROW_VECS) {
        const int width = rows / LANES - c < ROW_VECS ? rows / LANES - c : ROW_VECS;
        for (int t = 0; t < tile; t += KEY_BLOCK) {
            if (width == 3)
                score_keys(scores, queries_t, keys, t, c, 3, rows, head_dim);
            else if (width == 2)
                score_keys(scores, queries_t, keys, t, c, 2, rows, head_dim);
            else
                score_keys(scores, queries_t, keys, t, c, 1, rows, head_dim);
        }
    }
}

int paged_prefill_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                            const int32_t *block_tables, const int32_t *seq_lens, const int32_t *query_start_loc,
                            const int32_t *seq_ids, int num_ids, int num_heads, int num_kv_heads, int head_dim,
                            int block_size, int max_blocks, long q_stride, float scale) {
    const int group = num_heads / num_kv_heads;
    const int rows = group * QUERY_TILE; /* a multiple of LANES */
    const long row_size = (long)num_kv_heads * head_dim;

    /* the work items, the sequences' last query tiles first (they see the most keys) */
    int num_items = 0;
    for (int i = 0; i < num_ids; i++) {
        const int s = seq_ids[i];
        num_items += num_kv_heads * ((query_start_loc[s + 1] - query_start_loc[s] + QUERY_TILE - 1) / QUERY_TILE);
    }
    work_item *items = malloc(sizeof(work_item) * (size_t)(num_items > 0 ? num_items : 1));
    if (!items) return 1;
    int n = 0;
    for (int i = 0; i < num_ids; i++) {
        const int s = seq_ids[i], q_len = query_start_loc[s + 1] - query_start_loc[s];
        for (int first = (q_len - 1) / QUERY_TILE * QUERY_TILE; first >= 0; first -= QUERY_TILE)
            for (int g = 0; g < num_kv_heads; g++)
                items[n++] = (work_item){s, g, first, q_len - first < QUERY_TILE ? q_len - first : QUERY_TILE};
    }
    int failed = 0;

#pragma omp parallel
    {
        /* each thread's buffers: its rows' queries (transposed), scores (transposed: [key][row]),
           outputs and softmax state */
        float *queries_t = aligned_alloc(64, sizeof(float) * head_dim * rows);
        float *scores = aligned_alloc(64, sizeof(float) * KEY_TILE * rows);
        float *acc = aligned_alloc(64, sizeof(float) * rows * head_dim);
        float *state = malloc(sizeof(float) * 4 * rows); /* each row's maximum, sum, new maximum, rescale */
        const float *keys[KEY_TILE], *values[KEY_TILE];
        const int ok = queries_t && scores && acc && state;
        if (!ok) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(dynamic)
        for (int w = 0; w < num_items; w++) {
            if (!ok) continue;
            const work_item it = items[w];
            const int32_t *table = block_tables + (long)it.seq * max_blocks;
            const int q_len = query_start_loc[it.seq + 1] - query_start_loc[it.seq];
            const int first_row = query_start_loc[it.seq] + it.first_query;
            const int first_pos = seq_lens[it.seq] - q_len + it.first_query; /* the tile's first query's position */
            const int last_pos = first_pos + it.num_queries - 1;
            float *row_max = state, *row_sum = state + rows, *new_max = state + 2 * rows, *rescale = state + 3 * rows;
            /* row r = query j of the group's head h, r = h * QUERY_TILE + j, scaled; past the tile's queries, zeros */
            for (int h = 0; h < group; h++)
                for (int j = 0; j < QUERY_TILE; j++) {
                    const int r = h * QUERY_TILE + j;
                    const float *src = q + (long)(first_row + j) * q_stride + (long)(it.kv_head * group + h) * head_dim;
                    for (int d = 0; d < head_dim; d++) queries_t[(long)d * rows + r] = j < it.num_queries ? src[d] * scale : 0.f;
                }
            for (int r = 0; r < rows; r++) row_max[r] = -INFINITY, row_sum[r] = 0.f;
            memset(acc, 0, sizeof(float) * rows * head_dim);

            for (int k0 = 0; k0 <= last_pos; k0 += KEY_TILE) {
                const int tile = last_pos + 1 - k0 < KEY_TILE ? last_pos + 1 - k0 : KEY_TILE;
                const long head = (long)it.kv_head * head_dim;
                for (int t = 0; t < tile; t++) {
                    keys[t] = token_row(k_cache, table, k0 + t, block_size, row_size) + head;
                    values[t] = token_row(v_cache, table, k0 + t, block_size, row_size) + head;
                }
                for (int t = tile; t < KEY_TILE; t++) keys[t] = keys[0]; /* padding: scored, never weighed */
                score_tile(scores, queries_t, keys, tile, rows, head_dim);
                if (k0 + tile - 1 > first_pos) /* the diagonal: query j sees keys up to its position */
                    for (int r = 0; r < rows; r++) {
                        const int first_hidden = first_pos + r % QUERY_TILE + 1 - k0; /* in this tile */
                        for (int t = first_hidden > 0 ? first_hidden : 0; t < tile; t++) scores[(long)t * rows + r] = -INFINITY;
                    }
                /* the online softmax, vectorised across rows: the new maximum, what rescales the old sums */
                memcpy(new_max, row_max, sizeof(float) * rows);
                for (int t = 0; t < tile; t++) {
                    const float *s = scores + (long)t * rows;
#pragma omp simd
                    for (int r = 0; r < rows; r++) new_max[r] = s[r] > new_max[r] ? s[r] : new_max[r];
                }
#pragma omp simd
                for (int r = 0; r < rows; r++) {
                    rescale[r] = fast_exp(row_max[r] - new_max[r]); /* 0 (to float precision) on the first tile */
                    row_sum[r] *= rescale[r];
                    row_max[r] = new_max[r];
                }
                for (int t = 0; t < tile; t++) {
                    float *s = scores + (long)t * rows;
#pragma omp simd
                    for (int r = 0; r < rows; r++) {
                        s[r] = s[r] == -INFINITY ? 0.f : fast_exp(s[r] - new_max[r]);
                        row_sum[r] += s[r];
                    }
                }
                for (int r = 0; r < rows; r++)
                    for (int d = 0; d < head_dim; d++) acc[(long)r * head_dim + d] *= rescale[r];
                weigh_tile(acc, scores, values, tile, rows, head_dim);
            }
            for (int h = 0; h < group; h++)
                for (int j = 0; j < it.num_queries; j++) {
                    const int r = h * QUERY_TILE + j;
                    float *dst = out + ((long)(first_row + j) * num_heads + it.kv_head * group + h) * head_dim;
                    const float inv = 1.0f / row_sum[r];
                    for (int d = 0; d < head_dim; d++) dst[d] = acc[(long)r * head_dim + d] * inv;
                }
        }
        free(queries_t), free(scores), free(acc), free(state);
    }
    free(items);
    return failed;
}
