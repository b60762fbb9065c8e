/* The baseline ARM64 table (ARMv8-A Advanced SIMD, every aarch64 CPU): kernels/arm/arm.h with
 * int8 dots by widening multiplies (SMULL/SMULL2, |a * b| <= 16256 fits int16) and pairwise
 * accumulation (SADALP) into int32. Compiled with -march=armv8-a (pydecode/_build.py). */
#if defined(__aarch64__)
#include <arm_neon.h>

static inline __attribute__((always_inline)) int32x4_t dot_neon(int32x4_t acc, int8x16_t a, int8x16_t b) {
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
}
#define ARM_DOT dot_neon
#include "kernels/arm/arm.h"

const pd_kernels pd_kernels_neon = PD_KERNEL_TABLE("neon");
#endif
