/* Chapter 9's matmul for a decode step: y = x @ w.T + bias when x has only a few rows (tokens).

   With one to three rows, a matmul is a matrix-vector product: two flops per weight read, so its
   time is the time to read the weights from memory. On the course's 2-core CPU oneDNN's kernel (the
   fast path's prepacked matmul) read SmolLM2's layers at 16-21 GB/s, this loop at 28-29, a plain
   sum of one large tensor at 44. It reads each weight row once, front to back, and dots it with
   every row of x while the row is in the L1 cache (x itself, a few KB, stays there). OpenMP shares the output features among
   PyTorch's threads.

   float32. x [rows, k] and w [n, k] contiguous (torch's nn.Linear layout: a row per output feature);
   y [rows, n] with rows ldy floats apart, so several matmuls on one input (q, k and v) can write
   their outputs side by side into one tensor, as the fused fast path's single matmul would. */

void linear_few_rows(float *y, long ldy, const float *x, const float *w, const float *bias, long rows, long n,
                     long k) {
#pragma omp parallel for schedule(static)
    for (long j = 0; j < n; j++) {
        const float *wj = w + j * k;
        for (long r = 0; r < rows; r++) {
            const float *xr = x + r * k;
            float dot = 0.f;
#pragma omp simd reduction(+ : dot)
            for (long i = 0; i < k; i++) dot += xr[i] * wj[i];
            y[r * ldy + j] = dot + (bias ? bias[j] : 0.f);
        }
    }
}
