/* The constants of the vector exp that kernels/x86/exp.h (exp256) and kernels/x86/avx512.c (exp512) both
 * evaluate: exp(x) = 2^k * p(r), x = k*ln2 + r with ln2 split in two for an exact reduction,
 * |r| <= ln2/2, p a degree-6 polynomial (~2 ulp for x <= 0). Inputs below PD_EXP_MIN flush to 0
 * (their share of a softmax sum is below float resolution anyway). */
#ifndef PD_EXP_POLY_H
#define PD_EXP_POLY_H
#define PD_EXP_MIN    (-87.0f)
#define PD_EXP_LOG2E  1.44269504088896341f
#define PD_EXP_LN2_HI 0.693359375f
#define PD_EXP_LN2_LO (-2.12194440e-4f)
#define PD_EXP_P5     1.9875691500e-4f
#define PD_EXP_P4     1.3981999507e-3f
#define PD_EXP_P3     8.3334519073e-3f
#define PD_EXP_P2     4.1665795894e-2f
#define PD_EXP_P1     1.6666665459e-1f
#define PD_EXP_P0     5.0000001201e-1f
#endif
