/* Memory for data the kernels stream at every step (the repacked weights, the bandwidth
 * probe): anonymous pages aligned to 2 MiB and marked for transparent huge pages. With 4 KiB
 * pages a 1 GB stream takes a TLB miss every 4 KiB, and inside a virtual machine each miss is
 * a two-level page walk: on the 2-vCPU Zen 4 host one core read 23-24 GB/s with 4 KiB pages
 * and 27-31 GB/s with huge ones. Where the kernel has THP off (or set to "never") the madvise
 * is refused and the pages are ordinary ones: nothing else changes. */
#include "core/hugemem.h"

#include <stdint.h>
#include <sys/mman.h>

#define HUGE_ALIGN ((size_t)2 << 20)

static size_t rounded(size_t bytes) { return (bytes + HUGE_ALIGN - 1) / HUGE_ALIGN * HUGE_ALIGN; }

void *pd_huge_alloc(size_t bytes) {
    if (!bytes) return NULL;
    const size_t n = rounded(bytes), span = n + HUGE_ALIGN;
    char *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    /* keep the 2 MiB-aligned n bytes inside the span, give the rest back */
    char *a = (char *)(((uintptr_t)p + HUGE_ALIGN - 1) / HUGE_ALIGN * HUGE_ALIGN);
    if (a > p) munmap(p, (size_t)(a - p));
    if (p + span > a + n) munmap(a + n, (size_t)(p + span - (a + n)));
#ifdef MADV_HUGEPAGE
    (void)madvise(a, n, MADV_HUGEPAGE);
#endif
    return a;
}

void pd_huge_free(void *p, size_t bytes) {
    if (p) munmap(p, rounded(bytes));
}
