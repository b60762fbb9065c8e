/* Run-time choice of the kernel table: compiled in AND supported by this CPU (and its OS,
 * which must save the wide registers: __builtin_cpu_supports checks that via XGETBV). */
#include "kernels.h"
#include "pydecode.h"
#include <stdlib.h>
#include <string.h>

static int cpu_has_avx2(void) {
#if defined(PD_HAVE_AVX2) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

/* Named table if compiled in and usable here, else NULL. */
static const pd_kernels *by_name(const char *name) {
    if (strcmp(name, "scalar") == 0) return &pd_kernels_scalar;
#if defined(PD_HAVE_AVX2)
    if (strcmp(name, "avx2") == 0) return cpu_has_avx2() ? &pd_kernels_avx2 : NULL;
#endif
    return NULL;
}

static const pd_kernels *best(void) {
#if defined(PD_HAVE_AVX2)
    if (cpu_has_avx2()) return &pd_kernels_avx2;
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

/* The best this CPU supports, ignoring PYDECODE_ISA. */
const char *pd_isa_best(void) { return best()->name; }

int pd_isa_supported(const char *isa) { return isa != NULL && by_name(isa) != NULL; }
