/* The simulated device's memory: host allocations remembered in a table so that cx_gpu_mem_kind
 * can tell them from ordinary host memory. */
#include "sim.h"
#include "connex/options.h"
#include "cx_gpu.h"
#include "connex/log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct sim_alloc {
    uintptr_t base;
    size_t len;
};

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sim_alloc *g_tab; /* unsorted: a handful of buffers in practice */
static size_t g_n, g_cap, g_bytes;
static atomic_int g_enabled = -1; /* -1: CONNEX_GPU_SIM not read yet */

int cx_gpu_sim_enabled(void)
{
    int on = atomic_load(&g_enabled);
    if (on < 0) {
        unsigned long long on;
        (void)cx_opt_get_num("CONNEX_GPU_SIM", &on); /* default 0; a bad value is logged */
        int want = on != 0;
        int expect = -1;
        atomic_compare_exchange_strong(&g_enabled, &expect, want);
        on = atomic_load(&g_enabled);
    }
    return on;
}

void cx_gpu_sim_enable(int on)
{
    atomic_store(&g_enabled, on ? 1 : 0);
}

void *cx_gpu_sim_alloc(size_t len)
{
    if (!cx_gpu_sim_enabled()) {
        cx_error("sim alloc of %zu bytes: the simulated device is off (CONNEX_GPU_SIM=1 or "
                 "cx_gpu_sim_enable(1))",
                 len);
        return NULL;
    }
    if (len == 0 || len > ((size_t)1 << 40)) {
        cx_error("sim alloc: bad length %zu", len);
        return NULL;
    }
    size_t rounded = (len + 4095) & ~(size_t)4095;
    void *p = aligned_alloc(4096, rounded);
    if (!p) {
        cx_error("sim alloc of %zu bytes: out of memory", len);
        return NULL;
    }
    memset(p, 0, rounded); /* like device memory: resident from the start */
    pthread_mutex_lock(&g_mu);
    if (g_n == g_cap) {
        size_t ncap = g_cap ? 2 * g_cap : 16;
        struct sim_alloc *t = realloc(g_tab, ncap * sizeof *t);
        if (!t) {
            pthread_mutex_unlock(&g_mu);
            free(p);
            cx_error("sim alloc: out of memory for the table");
            return NULL;
        }
        g_tab = t;
        g_cap = ncap;
    }
    g_tab[g_n++] = (struct sim_alloc){ (uintptr_t)p, len };
    g_bytes += len;
    pthread_mutex_unlock(&g_mu);
    return p;
}

void cx_gpu_sim_free(void *p)
{
    if (!p) return;
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < g_n; i++) {
        if (g_tab[i].base == (uintptr_t)p) {
            g_bytes -= g_tab[i].len;
            g_tab[i] = g_tab[--g_n];
            if (g_n == 0) {
                free(g_tab);
                g_tab = NULL;
                g_cap = 0;
            }
            pthread_mutex_unlock(&g_mu);
            free(p);
            return;
        }
    }
    pthread_mutex_unlock(&g_mu);
    cx_error("sim free of %p: not a sim allocation (ignored)", p);
}

size_t cx_gpu_sim_bytes(void)
{
    pthread_mutex_lock(&g_mu);
    size_t b = g_bytes;
    pthread_mutex_unlock(&g_mu);
    return b;
}

int cx_sim_lookup(uintptr_t p, uintptr_t *base, size_t *len)
{
    int found = 0;
    pthread_mutex_lock(&g_mu);
    for (size_t i = 0; i < g_n; i++) {
        if (p >= g_tab[i].base && p - g_tab[i].base < g_tab[i].len) {
            *base = g_tab[i].base;
            *len = g_tab[i].len;
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&g_mu);
    return found;
}
