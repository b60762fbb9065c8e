/* Run-time choice of the kernel table: compiled in AND supported by this CPU (and its OS,
 * which must save the wide registers). Preference: avx512 > avxvnni > avx2 > scalar on x86-64,
 * i8mm > dotprod > neon on ARM64.
 *
 * OS support: __builtin_cpu_supports reads XCR0 with XGETBV (libgcc's cpuinfo; compiler-rt does
 * the same) and reports the AVX/AVX2/FMA/AVX-VNNI features only when the OS saves the YMM state,
 * and the AVX-512 ones only when it also saves the opmask and all 32 ZMM registers (XCR0 bits
 * 5..7). So no separate XGETBV check is needed here. */
#include "kernels/kernels.h"
#include "pydecode.h"
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define PD_X86 1
#endif

static int cpu_has_avx2(void) {
#if defined(PD_X86) && (defined(PD_HAVE_AVX2) || defined(PD_HAVE_AVX512) || defined(PD_HAVE_AVXVNNI))
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

static int cpu_has_avx512(void) {   /* what kernels/x86/avx512.c is compiled for */
#if defined(PD_X86) && defined(PD_HAVE_AVX512)
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

static int cpu_has_avxvnni(void) {
#if defined(PD_X86) && defined(PD_HAVE_AVXVNNI)
    return cpu_has_avx2() && __builtin_cpu_supports("avxvnni");
#else
    return 0;
#endif
}

/* ARM64: Advanced SIMD is part of every aarch64 CPU; the dot product (FEAT_DotProd) and the int8
 * matrix multiply (FEAT_I8MM) are read from the kernel's hardware capabilities on Linux
 * (HWCAP_ASIMDDP, bit 20 of AT_HWCAP; HWCAP2_I8MM, bit 13 of AT_HWCAP2) and from sysctl on
 * macOS. (The macros are spelled out: older libc headers lack them.) The i8mm table also runs
 * SDOT, so it needs both. */
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef AT_HWCAP2
#define AT_HWCAP2 26
#endif
static int cpu_has_dotprod(void) { return (getauxval(AT_HWCAP) >> 20) & 1; }
static int cpu_has_i8mm(void) { return cpu_has_dotprod() && ((getauxval(AT_HWCAP2) >> 13) & 1); }
#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
static int sysctl_flag(const char *name) {
    int v = 0;
    size_t n = sizeof v;
    return sysctlbyname(name, &v, &n, NULL, 0) == 0 && v != 0;
}
static int cpu_has_dotprod(void) { return sysctl_flag("hw.optional.arm.FEAT_DotProd"); }
static int cpu_has_i8mm(void) { return cpu_has_dotprod() && sysctl_flag("hw.optional.arm.FEAT_I8MM"); }
#else
static int cpu_has_dotprod(void) { return 0; }
static int cpu_has_i8mm(void) { return 0; }
#endif

/* Named table if compiled in and usable here, else NULL. */
static const pd_kernels *by_name(const char *name) {
    if (strcmp(name, "scalar") == 0) return &pd_kernels_scalar;
#if defined(PD_HAVE_AVX2)
    if (strcmp(name, "avx2") == 0) return cpu_has_avx2() ? &pd_kernels_avx2 : NULL;
#endif
#if defined(PD_HAVE_AVXVNNI)
    if (strcmp(name, "avxvnni") == 0) return cpu_has_avxvnni() ? &pd_kernels_avxvnni : NULL;
#endif
#if defined(PD_HAVE_AVX512)
    if (strcmp(name, "avx512") == 0) return cpu_has_avx512() ? &pd_kernels_avx512 : NULL;
#endif
#if defined(PD_HAVE_AVXVNNI_EVEX)   /* the AVX-VNNI table's logic on AVX-512 VNNI: tests, never the best */
    if (strcmp(name, "avxvnni_evex") == 0) return cpu_has_avx512() ? &pd_kernels_avxvnni_evex : NULL;
#endif
#if defined(PD_HAVE_NEON)
    if (strcmp(name, "neon") == 0) return &pd_kernels_neon;
#endif
#if defined(PD_HAVE_DOTPROD)
    if (strcmp(name, "dotprod") == 0) return cpu_has_dotprod() ? &pd_kernels_dotprod : NULL;
#endif
#if defined(PD_HAVE_I8MM)
    if (strcmp(name, "i8mm") == 0) return cpu_has_i8mm() ? &pd_kernels_i8mm : NULL;
#endif
    return NULL;
}

static const pd_kernels *best(void) {
#if defined(PD_HAVE_AVX512)
    if (cpu_has_avx512()) return &pd_kernels_avx512;
#endif
#if defined(PD_HAVE_AVXVNNI)
    if (cpu_has_avxvnni()) return &pd_kernels_avxvnni;
#endif
#if defined(PD_HAVE_AVX2)
    if (cpu_has_avx2()) return &pd_kernels_avx2;
#endif
#if defined(PD_HAVE_I8MM)
    if (cpu_has_i8mm()) return &pd_kernels_i8mm;
#endif
#if defined(PD_HAVE_DOTPROD)
    if (cpu_has_dotprod()) return &pd_kernels_dotprod;
#endif
#if defined(PD_HAVE_NEON)
    return &pd_kernels_neon;
#endif
    return &pd_kernels_scalar;
}

const pd_kernels *pd_kernels_select(const char *forced) {
    if (forced == NULL || forced[0] == '\0') {
        const char *env = getenv("PYDECODE_ISA");
        if (env == NULL || env[0] == '\0') return best();
        forced = env;
    }
    return by_name(forced);
}

const pd_kernels *pd_kernels_or_best(const char *isa) {
    const pd_kernels *k = pd_kernels_select(isa);
    return k ? k : best();
}

/* The best this CPU supports, ignoring PYDECODE_ISA. */
const char *pd_isa_best(void) { return best()->name; }

int pd_isa_supported(const char *isa) { return isa != NULL && by_name(isa) != NULL; }
