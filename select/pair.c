/* Per pair: which backend two engines use, from what each advertised. The order is a function of
 * the unordered pair of advertisements, so both ends agree without negotiating. */
#include "cx_select.h"
#include "probe_int.h"
#include "backends.h"
#include "connex/connex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cx_choice_format(const cx_choice_t *c, char *buf, size_t len)
{
    if (!c || !buf) return CX_EINVAL;
    int n = snprintf(buf, len, "%s/%s/0x%x", c->backend, c->variant, c->caps);
    return (n < 0 || (size_t)n >= len) ? CX_EINVAL : CX_OK;
}

int cx_choice_parse(const char *s, cx_choice_t *c)
{
    if (!s || !c) return CX_EINVAL;
    memset(c, 0, sizeof *c);
    const char *a = strchr(s, '/');
    const char *b = a ? strchr(a + 1, '/') : NULL;
    if (!a || !b || a == s || (size_t)(a - s) >= sizeof c->backend || (size_t)(b - a - 1) >= sizeof c->variant ||
        strncmp(b + 1, "0x", 2) || !b[3])
        return CX_EINVAL;
    char *end = NULL;
    unsigned long caps = strtoul(b + 3, &end, 16);
    if (*end || caps > 0xffffu) return CX_EINVAL;
    memcpy(c->backend, s, (size_t)(a - s));
    memcpy(c->variant, a + 1, (size_t)(b - a - 1));
    c->caps = (unsigned)caps;
    return CX_OK;
}

enum { PATH_NONE = 0, PATH_TCP = 1, PATH_RDMA = 2, PATH_SHM = 3 };

static int pair_path(const cx_choice_t *a, const cx_choice_t *b, int same_host, unsigned *common)
{
    *common = 0;
    if (strcmp(a->backend, b->backend)) return PATH_NONE;
    const cx_sel_backend_t *be = cx_sel_backend(a->backend);
    if (be && be->pairs && !be->pairs(a, b)) return PATH_NONE;
    unsigned c = a->caps & b->caps;
    *common = c;
    if (c & CX_CAP_RDMA) return PATH_RDMA;
    if (same_host && (c & CX_CAP_SHM)) return PATH_SHM;
    if (c & CX_CAP_TCP) return PATH_TCP;
    return PATH_NONE;
}

static double path_rate(const char *backend, int path)
{
    const cx_sel_backend_t *be = cx_sel_backend(backend);
    if (!be) return 0;
    switch (path) {
    case PATH_SHM: return be->rate_shm;
    case PATH_RDMA: return be->rate_rdma;
    case PATH_TCP: return be->rate_tcp;
    }
    return 0;
}

static const char *path_name(const char *backend, int path, unsigned common)
{
    const cx_sel_backend_t *be = cx_sel_backend(backend);
    switch (path) {
    case PATH_SHM: return be ? be->shm_path : "shared memory";
    case PATH_RDMA: return (common & CX_CAP_EFA) ? "rdma (efa)" : (common & CX_CAP_IB) ? "rdma (ib)" : "rdma (roce)";
    case PATH_TCP: return "tcp";
    }
    return "none";
}

/* An instance's same-host rate over the caps a pair has in common. */
static double samehost_rate(const cx_choice_t *c, unsigned common)
{
    cx_choice_t x = *c;
    x.caps = common;
    return cx_sel_samehost_rate(&x);
}

int cx_select_pair(const cx_choice_t *mine, int n_mine, const cx_choice_t *theirs, int n_theirs, int same_host,
                   int *order, char *why, size_t why_len)
{
    if (why && why_len) why[0] = 0;
    if (!mine || !theirs || !order || n_mine < 0 || n_theirs < 0) return 0;
    int path[CX_SEL_MAX_BE], n = 0;
    unsigned common[CX_SEL_MAX_BE];
    double local[CX_SEL_MAX_BE]; /* same host: the rate the backends were measured at */
    for (int i = 0; i < n_mine && i < CX_SEL_MAX_BE; i++) {
        path[i] = PATH_NONE;
        common[i] = 0;
        local[i] = 0;
        for (int j = 0; j < n_theirs; j++) {
            unsigned c;
            int pth = pair_path(&mine[i], &theirs[j], same_host, &c);
            if (pth > path[i]) {
                path[i] = pth;
                common[i] = c;
                /* the lower of the two ends' figures: the same number on both sides */
                double a = samehost_rate(&mine[i], c);
                double b = samehost_rate(&theirs[j], c);
                local[i] = a < b ? a : b;
            }
        }
        if (path[i] != PATH_NONE)
            order[n++] = i;
        else if (why) {
            const cx_sel_backend_t *be = cx_sel_backend(mine[i].backend);
            cx_sel_appendf(why, why_len, "%s: not shared%s; ", mine[i].backend, be ? be->unshared : "");
        }
    }
    /* insertion sort on (path class, measured rate, name rank): both sides sort the same keys.
     * On one host, RDMA (a loopback through the NIC) first, then every local path (shared memory
     * or loopback TCP) by the rate the backends were measured at on one host: what a backend
     * claims (UCX's shared-memory transports) is not what it runs (one tcp/lo lane). */
    int key[CX_SEL_MAX_BE];
    double rate[CX_SEL_MAX_BE];
    for (int k = 0; k < n; k++) {
        int i = order[k];
        key[i] = !same_host ? path[i] : path[i] == PATH_RDMA ? 2 : 1;
        rate[i] = same_host && path[i] != PATH_RDMA ? local[i] : path_rate(mine[i].backend, path[i]);
    }
    for (int i = 1; i < n; i++) {
        int x = order[i], j = i - 1;
        while (j >= 0) {
            int y = order[j];
            double rx = rate[x], ry = rate[y];
            int better = key[x] != key[y] ? key[x] > key[y]
                : rx != ry                ? rx > ry
                                          : cx_sel_backend_rank(mine[x].backend) < cx_sel_backend_rank(mine[y].backend);
            if (!better) break;
            order[j + 1] = y;
            j--;
        }
        order[j + 1] = x;
    }
    if (why)
        for (int k = 0; k < n; k++)
            cx_sel_appendf(why, why_len, "%s%s %s", k ? ", then " : "", mine[order[k]].backend,
                           path_name(mine[order[k]].backend, path[order[k]], common[order[k]]));
    return n;
}
