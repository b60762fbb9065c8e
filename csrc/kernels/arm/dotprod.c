/* The ARMv8.2 dot-product table (SDOT: every Apple M-series core, Cortex-A55/A76 and later,
 * Neoverse N1 and later): kernels/arm/arm.h with one vdotq_s32 per 16 int8 pairs, and the legacy
 * formats' 16-row repacked layouts by SDOT by element (kernels/arm/r16.h). Compiled with
 * -march=armv8.2-a+dotprod (pydecode/_build.py); dispatch.c picks it where the CPU reports the
 * feature (Linux: HWCAP_ASIMDDP; macOS: hw.optional.arm.FEAT_DotProd). */
#if defined(__aarch64__)
#include <arm_neon.h>

#define ARM_DOT vdotq_s32
#define ARM_R16 1
#include "kernels/arm/arm.h"

const pd_kernels pd_kernels_dotprod = PD_KERNEL_TABLE("dotprod", ARM_R16_NIBBLE_ENTRIES,
                                                    .matmul[PD_Q8_0_R16] = matmul_q8_0_r16);
#endif
