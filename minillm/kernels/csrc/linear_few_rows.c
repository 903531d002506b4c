/* Chapter 9's matmul for a decode step: y = x @ w.T + bias when x has only a few rows (tokens).

   With a few rows, a matmul reads far more weights than it does arithmetic on each: two flops per
   weight per row. The weights of a whole model do not fit in any cache, so every step streams them
   from memory, and the loop's job is to keep that stream moving. A step's SmolLM2 matmuls (30 layers'
   distinct weights, so each call finds its weights cold, as in the engine) on a 2-core AVX2 VM, one
   run: oneDNN's prepacked kernel (the fast path's other matmul) 54 ms at one row, this loop 38; at
   eight rows 76 against 61, at sixteen 94 against 81, at twenty-four 132 against 128, a tie
   (GEMV_MAX_ROWS in fast_model.py). On a 2-core AVX-512 VM the same step's matmuls, measured by
   python -m minillm.benchmarks.gemv_rows: this loop 24 ms at one row and about 2.7 ms more for each
   row after, oneDNN's 22-30 ms up to six rows; the loop wins at one and two rows only. Each of its
   multiply-adds also loads a vector of weights (from cache, for every row of x again): blocking rows
   as well as columns would let one load serve several rows (not tried).

   It takes COLS weight rows (output features) at a time and dots each row of x with all of them:
   COLS sums side by side in registers. One sum alone waits on itself at every step (a multiply-add's
   result takes several cycles to arrive, and the CPU can start more than one a cycle): a first version
   that dotted one weight row with one row of x at a time, measured the same way, won up to six rows (82
   against 86 ms) and lost from eight (97 against 76). The COLS weight rows (18 KB for SmolLM2's 576
   inputs) stay in cache while every row of x passes over them. OpenMP shares the blocks of output
   features among PyTorch's threads, each thread reading its weights front to back.

   float32. x [rows, k] and w [n, k] contiguous (torch's nn.Linear layout: a row per output feature);
   y [rows, n] with rows ldy floats apart, so several matmuls on one input (q, k and v) can write
   their outputs side by side into one tensor, as the fused fast path's single matmul would. */

#if defined(__AVX512F__)
#define LANES 16
#else
#define LANES 8
#endif
#define COLS 8 /* output features computed together */

typedef float vec __attribute__((vector_size(LANES * sizeof(float))));
typedef float vec_unaligned __attribute__((vector_size(LANES * sizeof(float)), aligned(4)));

/* y[r][j0 .. j0 + cols] = x[r] . w[j0 .. j0 + cols] + bias: cols <= COLS (a constant COLS in the usual call) */
static inline __attribute__((always_inline)) void dot_cols(float *y, const float *xr, const float *w, const float *bias,
                                                           long j0, int cols, long k) {
    vec acc[COLS];
    for (int c = 0; c < COLS; c++) acc[c] = (vec){0};
    const long whole = k / LANES * LANES;
    for (long i = 0; i < whole; i += LANES) {
        const vec xv = *(const vec_unaligned *)(xr + i);
        for (int c = 0; c < cols; c++) acc[c] += xv * *(const vec_unaligned *)(w + (j0 + c) * k + i);
    }
    for (int c = 0; c < cols; c++) {
        float dot = 0.f;
        for (int l = 0; l < LANES; l++) dot += acc[c][l];
        for (long i = whole; i < k; i++) dot += xr[i] * w[(j0 + c) * k + i];
        y[j0 + c] = dot + (bias ? bias[j0 + c] : 0.f);
    }
}

void linear_few_rows(float *y, long ldy, const float *x, const float *w, const float *bias, long rows, long n,
                     long k) {
    const long blocks = (n + COLS - 1) / COLS;
#pragma omp parallel for schedule(static)
    for (long b = 0; b < blocks; b++) {
        const long j0 = b * COLS;
        for (long r = 0; r < rows; r++) {
            if (n - j0 >= COLS)
                dot_cols(y + r * ldy, x + r * k, w, bias, j0, COLS, k);
            else /* the last, narrower block */
                dot_cols(y + r * ldy, x + r * k, w, bias, j0, (int)(n - j0), k);
        }
    }
}
