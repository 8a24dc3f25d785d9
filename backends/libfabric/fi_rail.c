/* Multi-rail: one libfabric domain, CQ, AV and endpoint per NIC (a rail), each a whole
 * single-domain backend (the rest of this folder, cx_fi_single_ops), under a hub that the core
 * sees as the backend. The hub advertises every rail's address in one blob and registers a
 * region with every rail's domain under one key blob; a peer with fewer rails is talked to over
 * the rails both have. Reads and writes from CONNEX_STRIPE_MIN on are cut into one stripe per
 * rail (the rails of the region's GPU, or all of them for host memory) and complete when every
 * stripe has; the first stripe error is the op's status. Smaller ones go over one rail, in
 * turn; messages and put_signal over rail 0, so that they stay in order. README.md,
 * "Multi-rail". */
#include "fi_int.h"
#include "connex/options.h"

#include "connex/log.h"
#include "connex/wire.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#define CX_FI_HUB_GPUS 64
#define CX_FI_HUB_ALIGN 4096u /* stripe cuts: page-aligned in the caller's buffer */

/* One op of the core cut into stripes (or one stripe: every xfer a rail gets comes from here). */
typedef struct cx_fi_grp {
    cx_xfer_t sub[CX_FI_RAILS_MAX];
    int rail_of[CX_FI_RAILS_MAX];
    cx_xfer_t *x;       /* the core's */
    cx_backend_t *hubb; /* the hub backend */
    int left;           /* stripes not completed yet (+1 while submit still posts) */
    int status;         /* the first stripe error, CX_OK */
} cx_fi_grp_t;

typedef struct cx_fi_hmh { /* a region registered with every rail */
    int n;
    int dev; /* the GPU holding it, -1 host memory */
    void *mh[CX_FI_RAILS_MAX];
} cx_fi_hmh_t;

struct cx_fi_hub {
    int n;
    cx_backend_t *rail[CX_FI_RAILS_MAX];
    char dom[CX_FI_RAILS_MAX][64];
    int efd; /* epoll over the rails' wait fds */
    size_t stripe_min;
    unsigned rr;                       /* rail of the next unstriped op */
    uint32_t gpu_mask[CX_FI_HUB_GPUS]; /* rails of GPU g (bit i: rail i); 0: every rail */
    uint64_t bytes[CX_FI_RAILS_MAX];   /* moved by completed stripes, per rail */
    uint64_t xfers[CX_FI_RAILS_MAX];   /* completed stripes, per rail */
    int fault_rail;                    /* CONNEX_FI_FAULT_RAIL: R, -1 off */
    uint64_t fault_at, fault_seen;     /* ... N, and stripes sent on R so far */
    struct cx_bep *eps;                /* every hub endpoint */
    cx_objcache_t grps;
    uint8_t addr[CX_FI_RAILS_MAX * 520 + 2];
    size_t addr_len;
};

/* ---- opening ---- */

/* Splits "a,b,c" into names; returns the count (at most max). */
static int cx_fi_split(const char *s, char (*out)[64], int max)
{
    int n = 0;
    while (s && *s && n < max) {
        size_t l = strcspn(s, ",; ");
        if (l > 0 && l < 64) {
            int dup = 0;
            for (int i = 0; i < n; i++)
                if (strlen(out[i]) == l && !strncmp(out[i], s, l)) dup = 1;
            if (!dup) {
                memcpy(out[n], s, l);
                out[n][l] = 0;
                n++;
            }
        }
        s += l;
        while (*s == ',' || *s == ';' || *s == ' ') s++;
    }
    return n;
}

/* tcp rails are interfaces: the address the rail binds (its first IPv4 one, else IPv6). */
static int cx_fi_if_addr(const char *ifname, char *ip, size_t n)
{
    struct ifaddrs *ifa = NULL;
    if (getifaddrs(&ifa)) return -1;
    int found = 0;
    for (int want = AF_INET; want && !found; want = want == AF_INET ? AF_INET6 : 0)
        for (struct ifaddrs *i = ifa; i && !found; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != want || strcmp(i->ifa_name, ifname)) continue;
            const void *a = want == AF_INET ? (const void *)&((struct sockaddr_in *)i->ifa_addr)->sin_addr
                                            : (const void *)&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
            if (want == AF_INET6 && IN6_IS_ADDR_LINKLOCAL((const struct in6_addr *)a)) continue;
            found = inet_ntop(want, a, ip, (socklen_t)n) != NULL;
        }
    freeifaddrs(ifa);
    return found ? 0 : -1;
}

/* Whether ip (numeric) is an address of interface ifname. */
static int cx_fi_if_has(const char *ifname, const char *ip)
{
    struct ifaddrs *ifa = NULL;
    if (!ip || getifaddrs(&ifa)) return 0;
    int on = 0;
    for (struct ifaddrs *a = ifa; a && !on; a = a->ifa_next) {
        char s[64];
        if (!a->ifa_addr || strcmp(a->ifa_name, ifname)) continue;
        int f = a->ifa_addr->sa_family;
        const void *ad = f == AF_INET ? (const void *)&((struct sockaddr_in *)a->ifa_addr)->sin_addr
            : f == AF_INET6           ? (const void *)&((struct sockaddr_in6 *)a->ifa_addr)->sin6_addr
                                      : NULL;
        on = ad && inet_ntop(f, ad, s, sizeof s) && !strcmp(s, ip);
    }
    freeifaddrs(ifa);
    return on;
}

static void cx_fi_hub_gpus(struct cx_fi_hub *h, const char *spec)
{
    /* "0=a,b;1=c": GPU g's rails by domain name */
    const char *s = spec;
    while (s && *s) {
        char *end;
        long g = strtol(s, &end, 10);
        if (end == s || *end != '=') break;
        s = end + 1;
        size_t l = strcspn(s, ";");
        char list[256];
        snprintf(list, sizeof list, "%.*s", (int)(l < sizeof list ? l : sizeof list - 1), s);
        char names[CX_FI_RAILS_MAX][64];
        int nn = cx_fi_split(list, names, CX_FI_RAILS_MAX);
        uint32_t m = 0;
        for (int k = 0; k < nn; k++)
            for (int i = 0; i < h->n; i++)
                if (!strcmp(names[k], h->dom[i])) m |= 1u << i;
        if (g >= 0 && g < CX_FI_HUB_GPUS) h->gpu_mask[g] = m;
        s += l;
        if (*s == ';') s++;
    }
}

static void cx_fi_hub_free(cx_backend_t *hb)
{
    struct cx_fi_hub *h = hb->hub;
    for (int i = 0; i < h->n; i++) cx_fi_single_ops.close(h->rail[i]);
    if (h->efd >= 0) close(h->efd);
    cx_objcache_drain(&h->grps);
    free(h);
    free(hb);
}

int cx_fi_open_rails(const cx_backend_params_t *p, cx_backend_t **out)
{
    *out = NULL;
    const char *list = NULL;
    (void)cx_opt_get_str("CONNEX_FI_RAILS", &list);
    if (!list || !*list) list = p->domains;
    char dom[CX_FI_RAILS_MAX][64];
    int nd = cx_fi_split(list, dom, CX_FI_RAILS_MAX);
    if (nd < 2) return CX_EUNSUPPORTED;
    const char *prov = p->provider;
    if (!prov || !*prov) (void)cx_opt_get_str("CONNEX_FI_PROVIDER", &prov);
    if (prov && !strcmp(prov, "shm")) {
        cx_info("libfabric: shm has one domain: no rails");
        return CX_EUNSUPPORTED;
    }
    cx_backend_t *hb = calloc(1, sizeof *hb);
    struct cx_fi_hub *h = calloc(1, sizeof *h);
    if (!hb || !h) {
        free(hb);
        free(h);
        return CX_ENOMEM;
    }
    hb->hub = h;
    hb->core = p->core;
    hb->inc = p->incarnation;
    h->efd = -1;
    h->fault_rail = -1;
    cx_objcache_init(&h->grps, sizeof(cx_fi_grp_t), CX_FI_OP_CACHE);
    char prov_buf[64] = "";
    for (int i = 0; i < nd; i++) {
        cx_backend_params_t q = *p;
        q.domain = dom[i];
        q.domains = NULL;
        if (prov_buf[0]) q.provider = prov_buf; /* rail 0's choice, for every rail */
        char ip[64];
        const char *qp = q.provider;
        if ((!qp || !*qp) && prov && *prov) qp = q.provider = prov;
        /* tcp: a rail is an interface, bound at its own address (the engine's where that is
         * on it). */
        if (qp && !strncmp(qp, "tcp", 3) && !cx_fi_if_has(dom[i], q.listen_ip) &&
            cx_fi_if_addr(dom[i], ip, sizeof ip) == 0)
            q.listen_ip = q.advertise_ip = ip;
        cx_backend_t *r = NULL;
        if (cx_fi_single_ops.open(&q, &r) != CX_OK) {
            cx_warn("libfabric: rail %s did not open: left out", dom[i]);
            continue;
        }
        const char *got = r->info->domain_attr && r->info->domain_attr->name ? r->info->domain_attr->name : "";
        if (strcmp(got, dom[i])) {
            /* The open fell back to another domain: not a rail of its own. */
            cx_warn("libfabric: rail %s opened as domain %s: left out", dom[i], got);
            cx_fi_single_ops.close(r);
            continue;
        }
        if (!prov_buf[0]) snprintf(prov_buf, sizeof prov_buf, "%s", r->prov);
        r->owner = hb;
        r->rail_idx = h->n;
        memcpy(h->dom[h->n], dom[i], sizeof h->dom[h->n]);
        h->rail[h->n++] = r;
    }
    if (h->n < 2) {
        cx_warn("libfabric: %d of %d rails opened: one domain instead", h->n, nd);
        cx_fi_hub_free(hb);
        return CX_EUNSUPPORTED;
    }
    snprintf(hb->prov, sizeof hb->prov, "%s", prov_buf);
    unsigned long long smin = 1u << 20;
    (void)cx_opt_get_num("CONNEX_STRIPE_MIN", &smin);
    h->stripe_min = (size_t)smin;
    const char *fault = NULL;
    (void)cx_opt_get_str("CONNEX_FI_FAULT_RAIL", &fault);
    unsigned fr, fn;
    if (fault && *fault) {
        if (sscanf(fault, "%u:%u", &fr, &fn) == 2 && fr < (unsigned)h->n && fn > 0) {
            h->fault_rail = (int)fr;
            h->fault_at = fn;
            cx_warn("libfabric: CONNEX_FI_FAULT_RAIL: stripe %u on rail %u will fail", fn, fr);
        } else {
            cx_warn("libfabric: CONNEX_FI_FAULT_RAIL=%s: want R:N with R < %d, N > 0; ignored", fault, h->n);
        }
    }
    cx_fi_hub_gpus(h, p->gpu_domains);
    h->efd = epoll_create1(EPOLL_CLOEXEC);
    int ok = h->efd >= 0;
    for (int i = 0; ok && i < h->n; i++) {
        struct epoll_event ev = { .events = EPOLLIN };
        ok = epoll_ctl(h->efd, EPOLL_CTL_ADD, cx_fi_single_ops.wait_fd(h->rail[i]), &ev) == 0;
    }
    cx_wr_t w;
    cx_wr_init(&w, h->addr, sizeof h->addr);
    cx_wr_u8(&w, CX_FI_ADDRS_VERSION);
    cx_wr_u8(&w, (uint8_t)h->n);
    for (int i = 0; i < h->n; i++) cx_wr_blob16(&w, h->rail[i]->addr, h->rail[i]->addr_len);
    if (!ok || !w.ok) {
        cx_warn("libfabric: rails: wait set or address blob failed");
        cx_fi_hub_free(hb);
        return CX_EUNSUPPORTED;
    }
    h->addr_len = w.len;
    char names[CX_FI_RAILS_MAX * 65] = "";
    for (int i = 0; i < h->n; i++) {
        size_t l = strlen(names);
        snprintf(names + l, sizeof names - l, "%s%s", i ? "," : "", h->dom[i]);
    }
    cx_info("libfabric: %s over %d rails (%s), striping from %zu bytes", hb->prov, h->n, names, h->stripe_min);
    *out = hb;
    return CX_OK;
}

/* ---- completion ---- */

static void cx_fi_grp_end(cx_fi_grp_t *g)
{
    cx_backend_t *hb = g->hubb;
    cx_xfer_t *x = g->x;
    int st = g->status;
    cx_objcache_put(&hb->hub->grps, g);
    cx_core_xfer_done(hb->core, x, st);
}

static void cx_fi_grp_sub_end(cx_fi_grp_t *g, int k, int status)
{
    struct cx_fi_hub *h = g->hubb->hub;
    if (status == CX_OK) {
        h->bytes[g->rail_of[k]] += g->sub[k].len;
        h->xfers[g->rail_of[k]]++;
    } else if (g->status == CX_OK) {
        g->status = status; /* the first stripe error is the op's */
    }
    if (--g->left == 0) cx_fi_grp_end(g);
}

void cx_fi_hub_sub_done(cx_backend_t *rail, cx_xfer_t *sx, int status)
{
    (void)rail;
    cx_fi_grp_sub_end(sx->bp[5], (int)(intptr_t)sx->bp[4], status);
}

/* ---- the ops ---- */

static void cx_fi_hub_disconnect(cx_backend_t *hb, cx_bep_t *ep, int why)
{
    struct cx_fi_hub *h = hb->hub;
    for (int i = 0; i < ep->nrails; i++)
        if (ep->rail[i]) cx_fi_single_ops.disconnect(h->rail[i], ep->rail[i], why);
    if (ep->fault) {
        cx_fi_grp_t *g = ep->fault;
        ep->fault = NULL;
        cx_fi_grp_sub_end(g, ep->fault_i, CX_EPEER);
    }
    if (ep->prev)
        ep->prev->next = ep->next;
    else
        h->eps = ep->next;
    if (ep->next) ep->next->prev = ep->prev;
    free(ep);
}

static void cx_fi_hub_close(cx_backend_t *hb)
{
    struct cx_fi_hub *h = hb->hub;
    while (h->eps) cx_fi_hub_disconnect(hb, h->eps, CX_ECLOSED);
    for (int i = 0; i < h->n; i++)
        cx_info("libfabric: rail %d (%s): %llu bytes in %llu transfers", i, h->dom[i], (unsigned long long)h->bytes[i],
                (unsigned long long)h->xfers[i]);
    cx_fi_hub_free(hb);
}

static int cx_fi_hub_connect(cx_backend_t *hb, void *peer, const void *addr, size_t addr_len, cx_bep_t **out)
{
    struct cx_fi_hub *h = hb->hub;
    const uint8_t *part;
    size_t pl;
    int rn;
    if (cx_fi_addr_rail(addr, addr_len, 0, &part, &pl, &rn)) {
        cx_warn("libfabric: connect: malformed address blob (%zu bytes)", addr_len);
        return CX_EINVAL;
    }
    int k = rn < h->n ? rn : h->n;
    cx_bep_t *ep = calloc(1, sizeof *ep);
    if (!ep) return CX_ENOMEM;
    ep->b = hb;
    ep->peer = peer;
    for (int i = 0; i < k; i++) {
        int rc = cx_fi_addr_rail(addr, addr_len, i, &part, &pl, &rn);
        if (rc == CX_OK) rc = cx_fi_single_ops.connect(h->rail[i], peer, part, pl, &ep->rail[i]);
        if (rc != CX_OK) {
            if (i == 0) {
                free(ep);
                return rc;
            }
            cx_info("libfabric: connect: rail %d (%s) to the peer failed (%d): %d rails", i, h->dom[i], rc, i);
            break;
        }
        ep->nrails = i + 1;
    }
    if (ep->nrails < h->n) cx_info("libfabric: a peer with %d rails: %d in common", rn, ep->nrails);
    ep->next = h->eps;
    if (h->eps) h->eps->prev = ep;
    h->eps = ep;
    *out = ep;
    return CX_OK;
}

/* The rails an op of this region may use: its GPU's, else every rail both sides have. */
static uint32_t cx_fi_hub_mask(struct cx_fi_hub *h, const cx_bep_t *ep, const cx_fi_hmh_t *m)
{
    uint32_t all = (1u << ep->nrails) - 1;
    if (m && m->dev >= 0 && m->dev < CX_FI_HUB_GPUS && (h->gpu_mask[m->dev] & all)) return h->gpu_mask[m->dev] & all;
    return all;
}

static int cx_fi_hub_submit(cx_backend_t *hb, cx_bep_t *ep, cx_xfer_t *x)
{
    struct cx_fi_hub *h = hb->hub;
    if (!ep || !x || ep->nrails < 1) {
        cx_warn("libfabric: submit without endpoint or xfer");
        return CX_EINVAL;
    }
    int rma = x->kind == CX_XFER_READ || x->kind == CX_XFER_WRITE;
    const cx_fi_hmh_t *m = x->kind == CX_XFER_MSG ? NULL : x->local_mh;
    uint32_t mask = cx_fi_hub_mask(h, ep, m);
    int rl[CX_FI_RAILS_MAX], nr = 0;
    if (rma && x->len >= h->stripe_min && __builtin_popcount(mask) > 1) {
        for (int i = 0; i < ep->nrails; i++)
            if (mask & (1u << i)) rl[nr++] = i;
    } else if (rma) {
        for (int t = 0; t < ep->nrails && !nr; t++) {
            int i = (int)(h->rr++ % (unsigned)ep->nrails);
            if (mask & (1u << i)) rl[nr++] = i;
        }
    }
    if (!nr) rl[nr++] = 0; /* messages and put_signal: rail 0, in order */
    cx_fi_grp_t *g = cx_objcache_get(&h->grps);
    if (!g) return CX_ENOMEM;
    g->x = x;
    g->hubb = hb;
    size_t chunk = x->len;
    if (nr > 1) {
        chunk = (x->len + (size_t)nr - 1) / (size_t)nr;
        chunk = (chunk + CX_FI_HUB_ALIGN - 1) / CX_FI_HUB_ALIGN * CX_FI_HUB_ALIGN;
    }
    int ns = 0;
    for (size_t off = 0, k = 0; k < (size_t)nr && (off < x->len || (k == 0 && !rma)); k++) {
        size_t len = x->len - off < chunk ? x->len - off : chunk;
        int r = rl[k];
        cx_xfer_t *s = &g->sub[ns];
        *s = *x;
        memset(s->bp, 0, sizeof s->bp);
        s->bp[4] = (void *)(intptr_t)ns;
        s->bp[5] = g;
        if (x->local) s->local = (char *)x->local + off;
        s->remote = x->remote + off;
        s->len = len;
        s->local_mh = m && r < m->n ? m->mh[r] : NULL;
        if (x->rkey && x->rkey_len) {
            const uint8_t *part;
            int kn;
            if (cx_fi_key_rail(x->rkey, x->rkey_len, r, &part, &s->rkey_len, &kn)) {
                cx_warn("libfabric: submit: the region's key has no part for rail %d", r);
                cx_objcache_put(&h->grps, g);
                return CX_EINVAL;
            }
            s->rkey = part;
        }
        g->rail_of[ns++] = r;
        off += len;
    }
    if (!ns) {
        cx_objcache_put(&h->grps, g);
        cx_warn("libfabric: submit: empty transfer");
        return CX_EINVAL;
    }
    g->left = ns + 1; /* held until every stripe is posted */
    int started = 0;
    for (int k = 0; k < ns; k++) {
        int r = g->rail_of[k];
        if (ns > 1 && r == h->fault_rail && ++h->fault_seen == h->fault_at && !ep->fault) {
            /* As a CQ error on this rail would: reported from progress, never inside submit. */
            ep->fault = g;
            ep->fault_i = k;
            cx_fi_kick(h->rail[r]);
            started++;
            continue;
        }
        int rc = cx_fi_single_ops.submit(h->rail[r], ep->rail[r], &g->sub[k]);
        if (rc == CX_OK) {
            started++;
            continue;
        }
        if (!started) {
            cx_objcache_put(&h->grps, g); /* nothing posted: not started */
            return rc;
        }
        if (g->status == CX_OK) g->status = rc;
        g->left--;
    }
    if (--g->left == 0) cx_fi_grp_end(g);
    return CX_OK;
}

/* CONNEX_FI_FAULT_RAIL's stripe, reported as a transport error on its rail. */
static void cx_fi_hub_faults(cx_backend_t *hb)
{
    struct cx_fi_hub *h = hb->hub;
    for (cx_bep_t *ep = h->eps; ep;) {
        if (!ep->fault) {
            ep = ep->next;
            continue;
        }
        cx_fi_grp_t *g = ep->fault;
        int k = ep->fault_i;
        ep->fault = NULL;
        char why[96];
        snprintf(why, sizeof why, "rail %d (%s): injected stripe failure (CONNEX_FI_FAULT_RAIL)", g->rail_of[k],
                 h->dom[g->rail_of[k]]);
        cx_warn("libfabric: %s", why);
        cx_core_peer_error(hb->core, ep->peer, CX_CAUSE_TRANSPORT, why); /* may disconnect ep */
        cx_fi_grp_sub_end(g, k, CX_EPEER);
        ep = h->eps; /* the list may have changed */
    }
}

static int cx_fi_hub_progress(cx_backend_t *hb)
{
    struct cx_fi_hub *h = hb->hub;
    cx_fi_hub_faults(hb);
    int more = 0;
    for (int i = 0; i < h->n; i++) more |= cx_fi_single_ops.progress(h->rail[i]);
    return more;
}

static int cx_fi_hub_poll(cx_backend_t *hb)
{
    struct cx_fi_hub *h = hb->hub;
    int got = 0;
    for (int i = 0; i < h->n; i++) got |= cx_fi_single_ops.poll(h->rail[i]);
    return got;
}

static int cx_fi_hub_mem_reg(cx_backend_t *hb, void *addr, size_t len, int mem_kind, void **mh, void *key,
                             size_t *key_len)
{
    struct cx_fi_hub *h = hb->hub;
    if (!mh || !key || !key_len) return CX_EINVAL;
    cx_fi_hmh_t *m = calloc(1, sizeof *m);
    if (!m) return CX_ENOMEM;
    m->dev = mem_kind == CX_MEM_HOST ? -1 : cx_core_mem_device(hb->core, addr, len);
    cx_wr_t w;
    cx_wr_init(&w, key, *key_len);
    cx_wr_u8(&w, CX_FI_KEYS_VERSION);
    cx_wr_u8(&w, (uint8_t)h->n);
    int rc = CX_OK;
    for (int i = 0; i < h->n && rc == CX_OK; i++) {
        uint8_t k[64];
        size_t kl = sizeof k;
        rc = cx_fi_single_ops.mem_reg(h->rail[i], addr, len, mem_kind, &m->mh[i], k, &kl);
        if (rc != CX_OK) break;
        m->n = i + 1;
        cx_wr_u8(&w, (uint8_t)kl);
        cx_wr_bytes(&w, k, kl);
    }
    if (rc == CX_OK && !w.ok) {
        cx_warn("libfabric: mem_reg: key buffer of %zu bytes too small for %d rails", *key_len, h->n);
        rc = CX_EINVAL;
    }
    if (rc != CX_OK) {
        for (int i = 0; i < m->n; i++) cx_fi_single_ops.mem_dereg(h->rail[i], m->mh[i]);
        free(m);
        return rc;
    }
    *key_len = w.len;
    *mh = m;
    return CX_OK;
}

static void cx_fi_hub_mem_dereg(cx_backend_t *hb, void *mh)
{
    cx_fi_hmh_t *m = mh;
    if (!m) return;
    for (int i = 0; i < m->n; i++) cx_fi_single_ops.mem_dereg(hb->hub->rail[i], m->mh[i]);
    free(m);
}

/* ---- the exported table: a hub's calls, or the single domain's ---- */

static int cx_fi_open(const cx_backend_params_t *p, cx_backend_t **out)
{
    int rc = cx_fi_open_rails(p, out);
    if (rc == CX_OK || rc == CX_ENOMEM) return rc;
    /* CONNEX_FI_RAILS with one name: that domain, one rail. */
    const char *list = NULL;
    char one[1][64];
    (void)cx_opt_get_str("CONNEX_FI_RAILS", &list);
    if (list && *list && !strpbrk(list, ",; ") && cx_fi_split(list, one, 1) == 1) {
        cx_backend_params_t q = *p;
        q.domain = one[0];
        q.domains = NULL;
        return cx_fi_single_ops.open(&q, out);
    }
    return cx_fi_single_ops.open(p, out);
}

static void cx_fi_close_any(cx_backend_t *b)
{
    if (b && b->hub)
        cx_fi_hub_close(b);
    else
        cx_fi_single_ops.close(b);
}

static int cx_fi_address_any(cx_backend_t *b, void *buf, size_t *len)
{
    if (!b->hub) return cx_fi_single_ops.address(b, buf, len);
    if (*len < b->hub->addr_len) return CX_EINVAL;
    memcpy(buf, b->hub->addr, b->hub->addr_len);
    *len = b->hub->addr_len;
    return CX_OK;
}

static int cx_fi_wait_fd_any(cx_backend_t *b)
{
    return b->hub ? b->hub->efd : cx_fi_single_ops.wait_fd(b);
}

static int cx_fi_progress_any(cx_backend_t *b)
{
    return b->hub ? cx_fi_hub_progress(b) : cx_fi_single_ops.progress(b);
}

static int cx_fi_poll_any(cx_backend_t *b)
{
    return b->hub ? cx_fi_hub_poll(b) : cx_fi_single_ops.poll(b);
}

static int cx_fi_mem_reg_any(cx_backend_t *b, void *addr, size_t len, int kind, void **mh, void *key, size_t *kl)
{
    return b->hub ? cx_fi_hub_mem_reg(b, addr, len, kind, mh, key, kl)
                  : cx_fi_single_ops.mem_reg(b, addr, len, kind, mh, key, kl);
}

static void cx_fi_mem_dereg_any(cx_backend_t *b, void *mh)
{
    if (b->hub)
        cx_fi_hub_mem_dereg(b, mh);
    else
        cx_fi_single_ops.mem_dereg(b, mh);
}

static int cx_fi_connect_any(cx_backend_t *b, void *peer, const void *addr, size_t len, cx_bep_t **ep)
{
    return b->hub ? cx_fi_hub_connect(b, peer, addr, len, ep) : cx_fi_single_ops.connect(b, peer, addr, len, ep);
}

static void cx_fi_disconnect_any(cx_backend_t *b, cx_bep_t *ep, int why)
{
    if (!ep) return;
    if (b->hub)
        cx_fi_hub_disconnect(b, ep, why);
    else
        cx_fi_single_ops.disconnect(b, ep, why);
}

static int cx_fi_submit_any(cx_backend_t *b, cx_bep_t *ep, cx_xfer_t *x)
{
    return b->hub ? cx_fi_hub_submit(b, ep, x) : cx_fi_single_ops.submit(b, ep, x);
}

static void cx_fi_submit_batch_any(cx_backend_t *b, cx_bep_t *ep, cx_xfer_t *const *xs, size_t n, int *rcs)
{
    if (!b->hub) {
        cx_fi_single_ops.submit_batch(b, ep, xs, n, rcs);
        return;
    }
    for (size_t i = 0; i < n; i++) rcs[i] = cx_fi_hub_submit(b, ep, xs[i]);
}

static void cx_fi_forget_region_any(cx_backend_t *b, cx_bep_t *ep, uint64_t region_id)
{
    (void)b;
    (void)ep;
    (void)region_id; /* keys are decoded per op, nothing is cached */
}

static void cx_fi_gpu_caps_any(cx_backend_t *b, cx_backend_gpu_caps_t *caps)
{
    cx_fi_single_ops.gpu_caps(b->hub ? b->hub->rail[0] : b, caps);
}

/* "tcp;ofi_rxm/lo+veth0": the provider and the domain of every rail the endpoint uses. */
static void cx_fi_ep_transport_any(cx_backend_t *b, cx_bep_t *ep, char *buf, size_t n)
{
    if (!b || !b->hub) {
        cx_fi_single_ops.ep_transport(b, ep, buf, n);
        return;
    }
    if (!n) return;
    buf[0] = 0;
    if (!ep || ep->nrails < 1) return;
    cx_fi_single_ops.ep_transport(b->hub->rail[0], ep->rail[0], buf, n);
    for (int i = 1; i < ep->nrails; i++) {
        size_t l = strlen(buf);
        snprintf(buf + l, n - l, "+%s", b->hub->dom[i]);
    }
}

const struct cx_backend_ops cx_libfabric_ops = {
    .version = CX_BACKEND_API_VERSION,
    .name = "libfabric",
    .open = cx_fi_open,
    .close = cx_fi_close_any,
    .address = cx_fi_address_any,
    .wait_fd = cx_fi_wait_fd_any,
    .progress = cx_fi_progress_any,
    .poll = cx_fi_poll_any,
    .mem_reg = cx_fi_mem_reg_any,
    .mem_dereg = cx_fi_mem_dereg_any,
    .connect = cx_fi_connect_any,
    .disconnect = cx_fi_disconnect_any,
    .submit = cx_fi_submit_any,
    .submit_batch = cx_fi_submit_batch_any,
    .forget_region = cx_fi_forget_region_any,
    .gpu_caps = cx_fi_gpu_caps_any,
    .ep_transport = cx_fi_ep_transport_any,
    .prepare = cx_fi_prepare,
};
