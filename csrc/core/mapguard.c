/* Guarding the memory-mapped model file against truncation while it is loaded.
 *
 * The weights are read straight from a read-only shared mapping of the GGUF file. If another
 * program truncates that file, a read of a page the file no longer backs raises SIGBUS, which
 * kills the process without a word. Inside a guarded range this handler maps a zero page over
 * the faulting one instead and counts the fault: the step finishes (with meaningless numbers),
 * and the Python side, which checks the count after every step, raises a clear error and
 * refuses the model from then on. A fault outside every guarded range is not ours: the previous
 * disposition is restored and the faulting instruction runs again under it (the usual crash, or
 * faulthandler's traceback).
 *
 * mmap is not on POSIX's list of async-signal-safe functions, but on Linux (and the BSDs) it is
 * a plain system call with no user-space state, the way databases that map their files use it. */
#include "pydecode.h"

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MAX_GUARDS 256

typedef struct {
    _Atomic uintptr_t lo, hi;   /* [lo, hi), 0 when the slot is free */
    _Atomic long faults;
} guard;

static guard guards[MAX_GUARDS];
static pthread_mutex_t guard_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction previous_bus;
static int installed;
static uintptr_t page_size;

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < MAX_GUARDS; i++) {
        uintptr_t lo = atomic_load_explicit(&guards[i].lo, memory_order_acquire);
        uintptr_t hi = atomic_load_explicit(&guards[i].hi, memory_order_acquire);
        if (lo && a >= lo && a < hi) {
            void *page = (void *)(a & ~(page_size - 1));
            if (mmap(page, page_size, PROT_READ, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) != MAP_FAILED) {
                atomic_fetch_add_explicit(&guards[i].faults, 1, memory_order_relaxed);
                return;   /* the read runs again and sees zeros */
            }
            break;
        }
    }
    sigaction(sig, &previous_bus, NULL);   /* not ours: the fault happens again under the old one */
}

int pd_guard_range(const void *base, size_t len) {
    if (!base || !len) return PD_EINVAL;
    pthread_mutex_lock(&guard_mu);
    if (!installed) {
        page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, &previous_bus) != 0) {
            pthread_mutex_unlock(&guard_mu);
            return PD_EINVAL;
        }
        installed = 1;
    }
    int id = PD_ENOMEM;
    for (int i = 0; i < MAX_GUARDS; i++) {
        if (atomic_load(&guards[i].lo) == 0) {
            atomic_store(&guards[i].faults, 0);
            atomic_store(&guards[i].hi, (uintptr_t)base + len);
            atomic_store_explicit(&guards[i].lo, (uintptr_t)base, memory_order_release);
            id = i;
            break;
        }
    }
    pthread_mutex_unlock(&guard_mu);
    return id;
}

void pd_unguard_range(int id) {
    if (id < 0 || id >= MAX_GUARDS) return;
    pthread_mutex_lock(&guard_mu);
    atomic_store_explicit(&guards[id].lo, 0, memory_order_release);
    atomic_store(&guards[id].hi, 0);
    pthread_mutex_unlock(&guard_mu);
}

long pd_guard_faults(int id) {
    if (id < 0 || id >= MAX_GUARDS) return 0;
    return atomic_load_explicit(&guards[id].faults, memory_order_relaxed);
}

#else   /* no SIGBUS: nothing to guard */
int pd_guard_range(const void *base, size_t len) { (void)base; (void)len; return PD_EINVAL; }
void pd_unguard_range(int id) { (void)id; }
long pd_guard_faults(int id) { (void)id; return 0; }
#endif
