/* Chapter 9's fused small ops: the work between a decoder layer's matmuls, one pass each.

   Written with PyTorch ops, a layer's RMSNorm is five calls (square, mean, add, rsqrt, two
   multiplies), its rotary embedding about a dozen, SiLU-and-multiply two: each call pays
   PyTorch's dispatch (microseconds: most of the work at one token) and reads and writes the
   whole tensor (most of the work at two thousand). Each function here does its op in one pass
   over memory, as vLLM's own kernels of the same names do (rms_norm, fused_add_rms_norm,
   rotary_embedding, silu_and_mul). Plain C: the engine compiles it on first use beside the
   attention kernel (minillm/kernels/cpu_build.py) and calls it through ctypes (cpu_ops.py).

   float32 throughout. A "row" is one token's `dim` floats; rows lie one after another, except the
   rotary embedding's, which lie `stride` floats apart. OpenMP shares the rows among PyTorch's threads. */

#include <math.h>
#include <stdint.h>
#include "fast_exp.h"

/* 1 / sqrt(mean(x^2) + eps) of one row, summed in double so the order of the sum hardly matters */
static float inv_rms(const float *x, int dim, float eps) {
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int i = 0; i < dim; i++) sum += (double)x[i] * x[i];
    return 1.0f / sqrtf((float)(sum / dim) + eps);
}

/* out = x / rms(x) * weight: the first layer's input norm */
void rms_norm(float *out, const float *x, const float *weight, long rows, int dim, float eps) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *o = out + r * dim;
        const float s = inv_rms(xr, dim, eps);
#pragma omp simd
        for (int i = 0; i < dim; i++) o[i] = weight[i] * (xr[i] * s);
    }
}

/* residual += x, then out = residual / rms(residual) * weight: a layer's skip connection and the
   next norm in one pass (the residual stream is read once and written once) */
void add_rms_norm(float *out, float *residual, const float *x, const float *weight, long rows, int dim, float eps) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        float *res = residual + r * dim, *o = out + r * dim;
        const float *xr = x + r * dim;
#pragma omp simd
        for (int i = 0; i < dim; i++) res[i] += xr[i];
        const float s = inv_rms(res, dim, eps);
#pragma omp simd
        for (int i = 0; i < dim; i++) o[i] = weight[i] * (res[i] * s);
    }
}

/* In place: each head of each row rotated by its token's angles, the "neox" pairing (channel i
   with i + head_dim/2). cos_sin_cache[position] holds head_dim/2 cosines, then the sines. */
void rotary_embedding(float *x, long rows, long stride, int num_heads, int head_dim, const int64_t *positions,
                      const float *cos_sin_cache) {
    const int half = head_dim / 2;
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        const float *cos = cos_sin_cache + positions[r] * head_dim, *sin = cos + half;
        for (int h = 0; h < num_heads; h++) {
            float *x1 = x + r * stride + (long)h * head_dim, *x2 = x1 + half;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                const float a = x1[i], b = x2[i];
                x1[i] = a * cos[i] - b * sin[i];
                x2[i] = b * cos[i] + a * sin[i];
            }
        }
    }
}

/* out[r, i] = silu(gate) * up, silu(g) = g / (1 + e^-g), where a row of gate_up holds the gate's
   `dim` values, then up's: the fused gate/up matmul's output is read once, with no split copy. */
void silu_and_mul(float *out, const float *gate_up, long rows, int dim) {
#pragma omp parallel for schedule(static)
    for (long r = 0; r < rows; r++) {
        const float *g = gate_up + r * 2 * dim, *u = g + dim;
        float *o = out + r * dim;
#pragma omp simd
        for (int i = 0; i < dim; i++) o[i] = g[i] / (1.0f + fast_exp(-g[i])) * u[i];
    }
}
