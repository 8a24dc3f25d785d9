/* The CONNEX_* environment variables: the table, its parser and the getters (connex/options.h).
 * README.md's configuration table lists the same names in the same words; keep both in step
 * (unit_options compares them). */
#include "connex/options.h"
#include "connex/connex.h"
#include "connex/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define B CX_OPT_BOOL
#define U CX_OPT_UINT
#define MS CX_OPT_MS
#define US CX_OPT_US
#define BY CX_OPT_BYTES
#define F CX_OPT_FLOAT
#define E CX_OPT_ENUM
#define S CX_OPT_STRING
#define GIB (1ull << 30)

static const cx_opt_def_t g_opts[] = {
    /* name, type, default, min, max, allowed, component, doc, secret */
    { "CONNEX_LOG", E, "warn", 0, 0, "error/0|warn/1|info/2|debug/3", "core", "log level on stderr", 0 },
    { "CONNEX_BACKEND", S, NULL, 0, 0, NULL, "core",
      "backends to open: auto or one name (unset: config.backend, else auto)", 0 },
    { "CONNEX_POLL_US", US, NULL, 0, 100000, NULL, "core",
      "poll window before sleeping (unset: 50 on hosts with 8+ CPUs, else 0)", 0 },
    { "CONNEX_DRIVE", B, "1", 0, 0, NULL, "core",
      "0: every op goes through the progress thread; 1: callers drive their own ops", 0 },
    { "CONNEX_DRIVE_SLEEP", B, "1", 0, 0, NULL, "core",
      "without a poll window, a caller driving its op sleeps on the transports' wait fds (0: hands it off)", 0 },
    { "CONNEX_CLASSES", B, NULL, 0, 0, NULL, "core",
      "off: no traffic classes, every op issued at once (unset: config.classes_off)", 0 },
    { "CONNEX_SAME_HOST_WATCH", B, "1", 0, 0, NULL, "core", "0: no shared-memory liveness watch of same-host peers",
      0 },
    { "CONNEX_DIRECTORY", S, NULL, 0, 0, NULL, "core",
      "identity directory: static or etcd://host:port (unset: config.directory, else static)", 0 },
    { "CONNEX_PEERS", S, NULL, 0, 0, NULL, "core", "the static directory's members: comma-separated URLs", 0 },
    { "CONNEX_ADVERTISE_IP", S, NULL, 0, 0, NULL, "core",
      "the address peers are told to connect to (unless config.advertise_ip; unset: listen_ip, "
      "or for 0.0.0.0 / :: the default-route interface's address)",
      0 },
    { "CONNEX_LEASE_MS", MS, NULL, 0, 86400000, NULL, "core",
      "directory lease (unset or 0: config.lease_ms, else 3000)", 0 },
    { "CONNEX_METRICS", S, NULL, 0, 0, NULL, "core",
      "serve GET /metrics (Prometheus text) on ip:port (unset: no listener)", 0 },
    { "CONNEX_AUTH_TOKEN", S, NULL, 0, 0, NULL, "core",
      "shared secret peers authenticate with (unless config.auth_token)", 1 },
    { "CONNEX_AUTH_TOKEN_FILE", S, NULL, 0, 0, NULL, "core", "file holding the shared secret", 0 },
    { "CONNEX_NET_DEVICES", S, NULL, 0, 0, NULL, "ucx,select", "NICs to use (UCX_NET_DEVICES; per GPU: gpu0=mlx5_2)",
      0 },
    { "CONNEX_UCX_READ_BOUNCE", E, "auto", 0, 0, "auto|1", "ucx", "1: every host read is a get into a bounce buffer",
      0 },
    { "CONNEX_UCX_READ_ANSWER_MIN", BY, "1048576", 0, 1ull << 40, NULL, "ucx",
      "shared-memory reads from this size on are answered by the target", 0 },
    { "CONNEX_UCX_CMA", E, "auto", 0, 0, "auto|off", "ucx",
      "shared-memory UCX: host reads and writes by same-host copies (off: through UCX)", 0 },
    { "CONNEX_UCX_CMA_MAX", BY, "1048576", 1, 1ull << 40, NULL, "ucx",
      "larger xfers than this keep UCX's path (a copy holds the transports while it runs)", 0 },
    { "CONNEX_UCX_ROTATE_ZOMBIES", U, "16", 0, 1u << 20, NULL, "ucx",
      "rotate the worker at this many dead endpoints (0: not for zombies)", 0 },
    { "CONNEX_UCX_ROTATE_GRACE_MS", MS, "5000", 0, 3600000, NULL, "ucx",
      "grace period before a rotated worker is closed", 0 },
    { "CONNEX_UCX_FAULT_WEDGE", B, "0", 0, 0, NULL, "ucx",
      "tests: a worker whose receive FIFO is in doubt is no longer progressed, as if wedged", 0 },
    { "CONNEX_FI_PROVIDER", S, NULL, 0, 0, NULL, "libfabric,select",
      "libfabric provider (efa, verbs;ofi_rxm, tcp;ofi_rxm, shm)", 0 },
    { "CONNEX_FI_RAILS", S, NULL, 0, 0, NULL, "libfabric",
      "the domains (NICs) to open as rails, comma-separated (unset: the plan's)", 0 },
    { "CONNEX_STRIPE_MIN", BY, "1048576", 4096, 1ull << 40, NULL, "libfabric",
      "transfers from this size on are striped over the rails", 0 },
    { "CONNEX_FI_FAULT_RAIL", S, NULL, 0, 0, NULL, "libfabric",
      "tests: R:N fails the N-th stripe sent on rail R as a transport error", 0 },
    { "CONNEX_FI_POLL_US", US, "100", 0, 1000000, NULL, "libfabric",
      "poll period of providers without a wait object while a peer cannot ring (0: busy-poll)", 0 },
    { "CONNEX_FI_SHM_DIRECT", E, "auto", 0, 0, "auto|0|1", "libfabric",
      "shm direct mode off / on (auto: on where the provider allows it)", 0 },
    { "CONNEX_FI_SHM_GUARD", B, "1", 0, 0, NULL, "libfabric",
      "0: no thread releasing shm spinlocks held by killed peers", 0 },
    { "CONNEX_FI_SHM_ROTATE_MS", MS, "200", 0, 600000, NULL, "libfabric",
      "move to a new shm region once ours is held this long (0: never)", 0 },
    { "CONNEX_FI_CMA", E, "auto", 0, 0, "auto|off", "libfabric",
      "shm: host reads and writes by same-host copies (off: through the provider)", 0 },
    { "CONNEX_FI_READ_INLINE", BY, "32768", 0, 65536, NULL, "libfabric",
      "tcp reads up to this size come back inside messages (0: off)", 0 },
    { "CONNEX_FI_TCP_READ", E, "auto", 0, 0, "auto|rma|writeback", "libfabric",
      "how tcp reads are done (auto: by provider version)", 0 },
    { "CONNEX_GDR", E, "auto", 0, 0, "auto|0/off/no|1/on/yes", "select,gpu", "GPUDirect RDMA use", 0 },
    { "CONNEX_HOST_ID", S, NULL, 0, 0, NULL, "select", "host identity for shared memory (unset: hostname/boot id)", 0 },
    { "CONNEX_PROBE_CUDA", E, "auto", 0, 0, "auto|0|1", "select",
      "0: never probe CUDA; 1: probe even without a visible GPU", 0 },
    { "CONNEX_SYSFS_ROOT", S, NULL, 0, 0, NULL, "select", "read a synthetic sysfs tree instead of /sys (tests)", 0 },
    { "CONNEX_LIBCUDA", S, "libcuda.so.1", 0, 0, NULL, "gpu", "the CUDA driver library to load", 0 },
    { "CONNEX_GPU_SIM", B, "0", 0, 0, NULL, "gpu", "1: the simulated GPU device is on", 0 },
    { "CONNEX_GPU_SIM_GBPS", F, "0", 0, 1000000, NULL, "gpu",
      "simulated copy engine speed in GB/s per direction (0: unlimited)", 0 },
    { "CONNEX_SYSFS_MODULE", S, "/sys/module", 0, 0, NULL, "gpu", "where loaded kernel modules are listed (tests)", 0 },
    { "CONNEX_STAGE_CHUNK", BY, "4194304", 1, GIB, NULL, "gpu", "staging chunk size", 0 },
    { "CONNEX_STAGE_SLOTS", U, "8", 1, 1024, NULL, "gpu", "staging slots", 0 },
    { "CONNEX_STAGE_PER_JOB", U, NULL, 1, 1024, NULL, "gpu",
      "staging slots one transfer may hold (unset: slots/2, at least 2)", 0 },
    { "CONNEX_STAGE_INLINE_MAX", BY, "65536", 0, 1048576, NULL, "gpu",
      "writes into a peer's staged device memory up to this size carry their bytes in the request (0: never)", 0 },
    { "CONNEX_STAGE_PEER_JOBS", U, "4", 1, 1024, NULL, "gpu",
      "ranges of its device memory a target stages for one peer at once; more wait", 0 },
    { "CONNEX_STAGE_SYNC_MAX", BY, "262144", 0, GIB, NULL, "gpu",
      "CUDA copies up to this size onto an idle stream are waited for, not called back (0: never)", 0 },
};

#define N_OPTS (sizeof g_opts / sizeof g_opts[0])

const cx_opt_def_t *cx_opt_table(size_t *n)
{
    *n = N_OPTS;
    return g_opts;
}

const cx_opt_def_t *cx_opt_find(const char *name)
{
    for (size_t i = 0; i < N_OPTS; i++)
        if (!strcmp(g_opts[i].name, name)) return &g_opts[i];
    return NULL;
}

/* The allowed words without their aliases: "auto|0|1". */
static void words(const char *allowed, char *out, size_t len)
{
    size_t o = 0;
    int skip = 0;
    for (const char *p = allowed; *p && o + 1 < len; p++) {
        if (*p == '|')
            skip = 0;
        else if (*p == '/') {
            skip = 1;
            continue;
        }
        if (!skip) out[o++] = *p;
    }
    out[o] = 0;
}

/* The index of s among the words (aliases count as their word), or -1. */
static int enum_index(const char *allowed, const char *s)
{
    int idx = 0;
    size_t sl = strlen(s);
    const char *p = allowed;
    while (*p) {
        size_t l = strcspn(p, "|/");
        if (l == sl && !strncasecmp(p, s, l)) return idx;
        p += l;
        if (*p == '|') idx++;
        if (*p) p++;
    }
    return -1;
}

static void range_text(const cx_opt_def_t *d, char *out, size_t len)
{
    switch (d->type) {
    case CX_OPT_BOOL: snprintf(out, len, "0|1 (off|on, no|yes, false|true)"); break;
    case CX_OPT_ENUM: words(d->allowed, out, len); break;
    case CX_OPT_STRING: snprintf(out, len, "any text"); break;
    default:
        snprintf(out, len, "%s%llu..%llu%s", d->type == CX_OPT_FLOAT ? "a number in " : "an integer in ", d->min,
                 d->max,
                 d->type == CX_OPT_BYTES    ? " bytes (K/M/G suffix allowed)"
                     : d->type == CX_OPT_MS ? " (milliseconds)"
                     : d->type == CX_OPT_US ? " (microseconds)"
                                            : "");
    }
}

int cx_opt_parse(const cx_opt_def_t *d, const char *s, unsigned long long *num, double *fnum, char *err, size_t errlen)
{
    unsigned long long v = 0;
    double f = 0;
    int ok = 1;
    switch (d->type) {
    case CX_OPT_STRING: break;
    case CX_OPT_BOOL: {
        int i = enum_index("0/off/no/false|1/on/yes/true", s);
        ok = i >= 0;
        v = i > 0;
        break;
    }
    case CX_OPT_ENUM: {
        int i = enum_index(d->allowed, s);
        ok = i >= 0;
        v = i > 0 ? (unsigned long long)i : 0;
        break;
    }
    case CX_OPT_FLOAT: {
        char *end;
        errno = 0;
        f = strtod(s, &end);
        ok = ((*s >= '0' && *s <= '9') || *s == '.') && !*end && !errno && f >= (double)d->min && f <= (double)d->max;
        break;
    }
    default: { /* digits only: no sign, no blanks */
        char *end;
        errno = 0;
        v = strtoull(s, &end, 10);
        ok = *s >= '0' && *s <= '9' && !errno;
        if (ok && d->type == CX_OPT_BYTES && *end) {
            int sh = (*end == 'k' || *end == 'K') ? 10
                : (*end == 'm' || *end == 'M')    ? 20
                : (*end == 'g' || *end == 'G')    ? 30
                                                  : 0;
            if (sh && v <= (~0ull >> sh)) {
                v <<= sh;
                end++;
            } else
                ok = 0;
        }
        ok = ok && !*end && v >= d->min && v <= d->max;
    }
    }
    if (num) *num = ok ? v : 0;
    if (fnum) *fnum = ok ? f : 0;
    if (!ok && err) {
        char r[160];
        range_text(d, r, sizeof r);
        snprintf(err, errlen, "%s=%.64s is not valid: expected %s", d->name, s, r);
    }
    return ok ? CX_OK : CX_EINVAL;
}

/* The default, parsed: the table's defaults are valid by construction (unit_options checks). */
static void dflt(const cx_opt_def_t *d, unsigned long long *num, double *fnum)
{
    if (num) *num = 0;
    if (fnum) *fnum = 0;
    if (d->dflt && d->type != CX_OPT_STRING) (void)cx_opt_parse(d, d->dflt, num, fnum, NULL, 0);
}

static int get(const char *name, unsigned long long *num, double *fnum, const char **str)
{
    const cx_opt_def_t *d = cx_opt_find(name);
    if (!d) {
        cx_error("options: %s is not in the options table", name);
        if (num) *num = 0;
        if (fnum) *fnum = 0;
        if (str) *str = NULL;
        return CX_EINVAL;
    }
    const char *s = getenv(name);
    if (str) *str = s && *s ? s : d->dflt;
    if (!s || !*s) {
        dflt(d, num, fnum);
        return 0;
    }
    char err[256];
    if (cx_opt_parse(d, s, num, fnum, err, sizeof err)) {
        cx_error("%s", err);
        dflt(d, num, fnum);
        if (str) *str = d->dflt;
        return CX_EINVAL;
    }
    return 1;
}

int cx_opt_get_num(const char *name, unsigned long long *out)
{
    return get(name, out, NULL, NULL);
}
int cx_opt_get_float(const char *name, double *out)
{
    return get(name, NULL, out, NULL);
}
int cx_opt_get_str(const char *name, const char **out)
{
    return get(name, NULL, NULL, out);
}

_Static_assert(N_OPTS <= CX_OPT_MAX, "raise CX_OPT_MAX");

int cx_opts_load(cx_opts_t *o)
{
    memset(o, 0, sizeof *o);
    size_t used = 0;
    for (size_t i = 0; i < N_OPTS; i++) {
        int rc = get(g_opts[i].name, &o->num[i], &o->fnum[i], &o->str[i]);
        /* A copy of what the environment holds (a bad value too, for a caller that reports it):
         * a later setenv must not reach a loaded table. */
        const char *env = rc == 1 ? o->str[i] : rc == CX_EINVAL ? getenv(g_opts[i].name) : NULL;
        if (env) {
            size_t l = strlen(env) + 1;
            if (l > sizeof o->text - used) {
                cx_error("%s: value of %zu bytes does not fit (all CONNEX_* text values together: at most %d bytes)",
                         g_opts[i].name, l - 1, CX_OPT_TEXT - 1);
                rc = CX_EINVAL;
                o->str[i] = g_opts[i].dflt;
            } else {
                memcpy(o->text + used, env, l);
                o->str[i] = o->text + used;
                used += l;
            }
        }
        if (rc == CX_EINVAL) o->bad++;
        o->set[i] = rc == 1;
        o->invalid[i] = rc == CX_EINVAL;
    }
    return o->bad ? CX_EINVAL : CX_OK;
}

static size_t index_of(const char *name)
{
    const cx_opt_def_t *d = cx_opt_find(name);
    if (!d) {
        cx_error("options: %s is not in the options table", name);
        return N_OPTS;
    }
    return (size_t)(d - g_opts);
}

int cx_opts_bad(const cx_opts_t *o, const char *name)
{
    size_t i = index_of(name);
    return i < N_OPTS && o->invalid[i];
}

unsigned long long cx_opts_num(const cx_opts_t *o, const char *name, int *set)
{
    size_t i = index_of(name);
    if (set) *set = i < N_OPTS && o->set[i];
    return i < N_OPTS ? o->num[i] : 0;
}

const char *cx_opts_str(const cx_opts_t *o, const char *name)
{
    size_t i = index_of(name);
    return i < N_OPTS ? o->str[i] : NULL;
}

size_t cx_options_report(char *buf, size_t len)
{
    size_t need = 0;
    for (size_t i = 0; i < N_OPTS; i++) {
        const cx_opt_def_t *d = &g_opts[i];
        const char *s = getenv(d->name);
        int set = s && *s;
        char err[8], r[160];
        int bad = set && d->type != CX_OPT_STRING && cx_opt_parse(d, s, NULL, NULL, err, sizeof err);
        const char *val = set ? s : d->dflt ? d->dflt : "(unset)";
        if (set && d->secret) val = "(set, not shown)";
        range_text(d, r, sizeof r);
        int n = snprintf(buf && need < len ? buf + need : NULL, buf && need < len ? len - need : 0,
                         "%-28s %-20s %-11s %-16s %s [%s]\n", d->name, val,
                         bad       ? "BAD"
                             : set ? "environment"
                                   : "default",
                         d->component, d->doc, r);
        if (n > 0) need += (size_t)n;
    }
    return need;
}
