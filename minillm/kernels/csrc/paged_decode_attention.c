/* Chapter 9's CPU attention kernel: decode attention read straight from the paged KV pool.

   The PyTorch backend gathers every decoding request's blocks into one padded tensor, in every
   layer of every step, and then attends over the copy: the context is read twice and written once.
   This loop reads each key and value once, where it lies, through the block table (as vLLM's CPU
   attention kernels do). Plain C: the engine compiles it on first use (minillm/kernels/cpu_attention.py)
   and calls it through ctypes. OpenMP shares the requests among PyTorch's threads.

   The loop order is the point: a request's tokens in order, every head of a token together, so a
   block is read front to back as it lies in memory. A first version that walked one KV head at a
   time (strided reads) took 3.0 ms per layer for 32 requests of ~216 tokens on SmolLM2 once the
   30 layers' pools no longer fit in the cache; this one 0.8 ms (the gather + SDPA path: 1.9 ms).

   Blocks lie anywhere in the pool, so the CPU's prefetcher, which follows addresses that rise
   steadily, loses the thread at every block boundary and each new block starts with a wait on
   memory. While reading token t, the loop asks for the same token of the next block
   (__builtin_prefetch: a hint, no result). SmolLM2's 30 layers on the course's 2-core CPU, the
   loop without and with it in turn: ten requests of ~860 tokens 43.5 -> 35.1 ms a step, thirty of
   ~220 31.8 -> 26.1 ms, thirty of ~80 11.9 -> 10.2 ms (two blocks ahead was slower than one).

   Shapes (float32, contiguous): q and out [num_seqs, num_heads, head_dim], one query per sequence;
   k_cache and v_cache [num_blocks, block_size, num_kv_heads, head_dim]; block_tables
   [num_seqs, max_blocks] and seq_lens [num_seqs] (context including this step's token) int32. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "fast_exp.h"

#define FLOATS_PER_LINE 16 /* a 64-byte cache line */

/* logical block b's first token (keys or values, all KV heads), through the block table */
static inline const float *block_start(const float *cache, const int32_t *table, int b, int block_size, long row_size) {
    return cache + (long)table[b] * block_size * row_size;
}

int paged_decode_attention(float *out, const float *q, const float *k_cache, const float *v_cache,
                           const int32_t *block_tables, const int32_t *seq_lens, int num_seqs, int num_heads,
                           int num_kv_heads, int head_dim, int block_size, int max_blocks, float scale) {
    const int group = num_heads / num_kv_heads; /* query heads sharing one KV head (GQA) */
    const long row_size = (long)num_kv_heads * head_dim; /* one token's keys (or values), all heads */
    int max_len = 0;
    for (int s = 0; s < num_seqs; s++)
        if (seq_lens[s] > max_len) max_len = seq_lens[s];
    int failed = 0;

#pragma omp parallel
    {
        /* each thread's scores: one row of max_len per query head */
        float *scores = malloc(sizeof(float) * (size_t)num_heads * (size_t)(max_len > 0 ? max_len : 1));
        if (!scores) {
#pragma omp atomic write
            failed = 1;
        }
        /* one sequence per iteration, its tokens in order: a block's keys (then its values) are
           read front to back, every head of a token together, as the memory lies */
#pragma omp for schedule(dynamic)
        for (int s = 0; s < num_seqs; s++) {
            if (!scores) continue;
            const int len = seq_lens[s];
            const int32_t *table = block_tables + (long)s * max_blocks;
            const float *qs = q + (long)s * num_heads * head_dim;
            float *os = out + (long)s * num_heads * head_dim;

            /* pass 1: every key once, dotted with the queries of the heads that share it */
            for (int t = 0; t < len; t++) {
                const int b = t / block_size, i = t % block_size;
                const float *k = block_start(k_cache, table, b, block_size, row_size) + i * row_size;
                if (t + block_size < len) { /* the same token of the next block, asked for now (see above) */
                    const float *ahead = block_start(k_cache, table, b + 1, block_size, row_size) + i * row_size;
                    for (long x = 0; x < row_size; x += FLOATS_PER_LINE) __builtin_prefetch(ahead + x);
                }
                for (int h = 0; h < num_heads; h++) {
                    const float *qh = qs + (long)h * head_dim, *kh = k + (long)(h / group) * head_dim;
                    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                    for (int d = 0; d < head_dim; d++) dot += qh[d] * kh[d];
                    scores[(long)h * max_len + t] = dot * scale;
                }
            }
            /* softmax of each head's row, its maximum subtracted first so exp cannot overflow */
            for (int h = 0; h < num_heads; h++) {
                float *row = scores + (long)h * max_len, top = -INFINITY, sum = 0.f;
                for (int t = 0; t < len; t++) top = row[t] > top ? row[t] : top;
#pragma omp simd reduction(+ : sum)
                for (int t = 0; t < len; t++) {
                    row[t] = fast_exp(row[t] - top);
                    sum += row[t];
                }
                const float inv_sum = 1.0f / sum;
#pragma omp simd
                for (int t = 0; t < len; t++) row[t] *= inv_sum;
                for (int d = 0; d < head_dim; d++) os[(long)h * head_dim + d] = 0.f;
            }
            /* pass 2: every value once, weighted into each head's output */
            for (int t = 0; t < len; t++) {
                const int b = t / block_size, i = t % block_size;
                const float *v = block_start(v_cache, table, b, block_size, row_size) + i * row_size;
                if (t + block_size < len) {
                    const float *ahead = block_start(v_cache, table, b + 1, block_size, row_size) + i * row_size;
                    for (long x = 0; x < row_size; x += FLOATS_PER_LINE) __builtin_prefetch(ahead + x);
                }
                for (int h = 0; h < num_heads; h++) {
                    const float p = scores[(long)h * max_len + t], *vh = v + (long)(h / group) * head_dim;
                    float *o = os + (long)h * head_dim;
#pragma omp simd
                    for (int d = 0; d < head_dim; d++) o[d] += p * vh[d];
                }
            }
        }
        free(scores);
    }
    return failed;
}
