/* The ARMv8.6 int8 matrix-multiply table (SMMLA, FEAT_I8MM: Apple M2 and later, Cortex-A710/X2
 * and later, Neoverse V1/N2/V2, Snapdragon X): the dot-product table (SDOT for one column) with
 * the batch tiles of kernels/arm/mmla.h for prefill and batched decode, where 4 rows meet 2+
 * columns of a legacy format in the file's layout (Q8_0, which this table does not repack; the
 * others when repacking is off or a tensor cannot be repacked); the nibble formats' repacked layouts as dotprod runs them.
 * Compiled with -march=armv8.2-a+dotprod+i8mm (pydecode/_build.py); dispatch.c picks it where
 * the CPU reports both features (Linux: HWCAP2_I8MM; macOS: hw.optional.arm.FEAT_I8MM). */
#if defined(__aarch64__)
#include <arm_neon.h>

#define ARM_DOT vdotq_s32
#define ARM_MMLA 1
#define ARM_R16 1
#include "kernels/arm/arm.h"

const pd_kernels pd_kernels_i8mm = PD_KERNEL_TABLE("i8mm", ARM_R16_NIBBLE_ENTRIES);
#endif
