/* Order-preserving 32-bit keys of floats (a larger float has a larger key; -0 == +0, as the
 * comparisons elsewhere see them), and back: the radix sorts and histograms of the sampler
 * (sampling.c) and of its summary (sampling/summary.c) work on these. */
#ifndef PD_FKEY_H
#define PD_FKEY_H
#include <stdint.h>
#include <string.h>

static inline uint32_t fkey(float f) {
    uint32_t u;
    f = f == 0.0f ? 0.0f : f;
    memcpy(&u, &f, 4);
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

static inline float fkey_inv(uint32_t k) {
    uint32_t u = k & 0x80000000u ? k & 0x7fffffffu : ~k;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#endif
