/* fast_exp: e^x in a form the compiler vectorises, shared by chapter 9's C kernels. */

#ifndef MINILLM_FAST_EXP_H
#define MINILLM_FAST_EXP_H

#include <stdint.h>
#include <string.h>

/* e^x as a loop the compiler can vectorise (libm's expf is a call per element): e^x = 2^n * e^f
   with n = round(x / ln 2) and |f| <= ln(2) / 2, e^f by its Taylor series to f^7 (relative error
   below 1e-7), 2^n written straight into a float's exponent bits. Adding 1.5 * 2^23 rounds x / ln 2
   to an integer held in the sum's low bits: no float-to-int conversion, which (unlike this) the
   compiler will not vectorise next to the clamps. x is clamped to [-87, 88], where 2^n is a normal
   float: a softmax or a sigmoid needs e^x only huge or tiny out there, not exact. */
static inline float fast_exp(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    const float shifted = x * 1.44269504f + 12582912.0f;
    const float n = shifted - 12582912.0f;
    const float f = (x - n * 0.693145752f) - n * 1.42860677e-6f; /* ln 2 in two parts: f stays exact */
    float p = 1.0f / 5040;
    p = p * f + 1.0f / 720;
    p = p * f + 1.0f / 120;
    p = p * f + 1.0f / 24;
    p = p * f + 1.0f / 6;
    p = p * f + 0.5f;
    p = p * f + 1.0f;
    p = p * f + 1.0f;
    int32_t bits;
    memcpy(&bits, &shifted, sizeof bits);
    bits = (bits - 0x4B400000 + 127) << 23; /* 0x4B400000: the bits of 1.5 * 2^23 itself */
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return p * two_n;
}

#endif
