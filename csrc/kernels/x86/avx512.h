/* What the AVX-512 files (x86/avx512.c, x86/avx512_kquant.c) share: their tunables and
 * helpers on top of x86/common.h. Included inside their ISA guard. */
#ifndef PD_X86_AVX512_H
#define PD_X86_AVX512_H
#include "kernels/kernels.h"
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

/* Only the FMAs written in the kernels (see x86/avx2.c). */
#pragma GCC optimize("fp-contract=off")

#ifndef QCMAX
#define QCMAX 4 /* max columns per legacy-format tile */
#endif
#ifndef KCMAX
#define KCMAX 4 /* K-quants */
#endif
#ifndef FCMAX
#define FCMAX 4 /* float formats */
#endif
#ifndef PF_DIST
#define PF_DIST 4096 /* bytes ahead per weight row */
#endif
#include "kernels/x86/common.h"
#include "kernels/x86/tiles.h"

AI float hsum512(__m512 v) {
    return hsum(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
}
#endif
