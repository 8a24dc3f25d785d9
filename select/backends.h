/* Internal to select/: what the selection knows about each backend, one entry per backend
 * (backends.c). The policy, the plan, the per-pair order and the reports go through this table;
 * nothing else in select/ compares backend names. A new backend adds its entry here (and its
 * library probe, probe_libs.c, when the policy needs one). */
#ifndef CX_SELECT_BACKENDS_H
#define CX_SELECT_BACKENDS_H

#include "cx_select.h"

typedef struct cx_sel_backend {
    const char *name;    /* cx_backend_ops.name, cx_choice_t.backend */
    const char *label;   /* in reasons ("UCX") */
    const char *package; /* the Debian package a build with it needs */
    unsigned probes;     /* CX_PROBE_* the policy reads to decide its instance */
    unsigned reach;      /* CX_CAP_* an instance of it may have: which rules consider it */
    /* GB/s measured (rates.h), 0: not measured. tcp_words names the TCP path in the rule's list. */
    double rate_tcp, rate_rdma, rate_shm;
    const char *tcp_words;
    const char *shm_path;                         /* a same-host pair over it, in words */
    const char *rdma_words;                       /* what it runs on an RDMA port, for the rdma rule */
    const char *rdma_transports, *shm_transports; /* in the plan's transport list */
    const char *gdr_via;                          /* how it registers GPU memory */
    const char *unshared;                         /* appended to "not shared" in a pair's reasons */
    int one_variant;                 /* an instance runs one provider: one that reaches only shared memory is
                        opened for same-host peers, and it cannot also carry TCP */
    int shows_domain, shows_devices; /* the plan report names its domain / devices */
    /* Its instance on this host: 1 (c filled), 0 not usable (a reason says why), < 0 an error
     * (d->error). take_rdma: no backend before it in the table reaches the active RDMA ports.
     * forced: CONNEX_BACKEND names it (its absence is then an error). */
    int (*instance)(const cx_probe_t *p, const cx_select_opts_t *o, int take_rdma, cx_choice_t *c, cx_decision_t *d,
                    int forced);
    /* Same-host rate of an instance (0: not measured). NULL: rate_shm. */
    double (*samehost_rate)(const cx_choice_t *c);
    /* Two instances of it can address each other. NULL: always. */
    int (*pairs)(const cx_choice_t *a, const cx_choice_t *b);
    /* What its open is given for d->be[i] (provider, domain, devices), with a reason. NULL: nothing. */
    void (*plan)(const cx_probe_t *p, const cx_select_opts_t *o, cx_decision_t *d, int i, cx_plan_be_t *pl);
    /* Why it cannot register GPU memory on this host (why[0] == 0: it can). NULL: it can. */
    void (*gdr_why)(const cx_probe_t *p, const cx_choice_t *c, char *why, size_t len);
    /* What its library lists, for a reason ("efa,tcp;ofi_rxm"). NULL: nothing to list. */
    const char *(*inventory)(const cx_probe_t *p);
} cx_sel_backend_t;

/* The table, in the build's order of preference (the tie-break everywhere); n entries. */
extern const cx_sel_backend_t cx_sel_backends[];
extern const int cx_sel_n_backends;
/* The entry of a backend name, or NULL. */
const cx_sel_backend_t *cx_sel_backend(const char *name);
/* Its place in the table (the tie-break rank); cx_sel_n_backends when unknown. */
int cx_sel_backend_rank(const char *name);
/* The names, '|'-separated ("ucx|libfabric|zmq"). */
void cx_sel_backend_names(char *buf, size_t len);
/* A backend instance's same-host rate (0: not measured, or an unknown backend). */
double cx_sel_samehost_rate(const cx_choice_t *c);

#endif
