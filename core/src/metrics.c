/* The Prometheus text exposition (format 0.0.4) of an engine: its counters, its peers, and the
 * latency histograms of ops initiated here. Written by the progress thread, which owns every
 * number it reads (engine.h); cx_stats_format runs it through an exec. */
#include "engine.h"

#include "connex/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

const uint64_t cx_hist_bounds_ns[CX_HIST_BUCKETS] = {
    10000ull,     25000ull,      50000ull,      100000ull,     250000ull,      500000ull,    1000000ull,
    2500000ull,   5000000ull,    10000000ull,   25000000ull,   50000000ull,    100000000ull, 250000000ull,
    500000000ull, 1000000000ull, 2500000000ull, 5000000000ull, 10000000000ull,
};

static const char *const le_names[CX_HIST_BUCKETS] = {
    "1e-05", "2.5e-05", "5e-05", "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01",
    "0.025", "0.05",    "0.1",   "0.25",   "0.5",     "1",      "2.5",   "5",      "10",
};
static const char *const opk_names[CX_OPK_COUNT] = { "read", "write", "put_signal", "msg" };
static const char *const state_names[] = { "unknown", "connecting", "up", "suspect", "failed", "left" };

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} sb_t;

static void sb_printf(sb_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sb_t *b, const char *fmt, ...)
{
    if (b->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t nc = b->cap * 2;
        while (nc - b->len <= (size_t)n) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
}

/* A label value: backslash, double quote and newline escaped, as the format wants. */
static const char *esc(const char *s, char *out, size_t n)
{
    size_t o = 0;
    for (; *s && o + 3 < n; s++) {
        if (*s == '\\' || *s == '"') {
            out[o++] = '\\';
            out[o++] = *s;
        } else if (*s == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else
            out[o++] = *s;
    }
    out[o] = 0;
    return out;
}

static void family(sb_t *b, const char *name, const char *type, const char *help)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void one(sb_t *b, const char *name, const char *type, const char *help, uint64_t v)
{
    family(b, name, type, help);
    sb_printf(b, "%s %llu\n", name, (unsigned long long)v);
}

static void per_op(sb_t *b, const char *name, const char *type, const char *help, const uint64_t *v)
{
    family(b, name, type, help);
    for (int k = 0; k < CX_OPK_COUNT; k++)
        sb_printf(b, "%s{op=\"%s\"} %llu\n", name, opk_names[k], (unsigned long long)v[k]);
}

static uint64_t in_flight(const cx_peer_t *p)
{
    uint64_t n = 0;
    for (const cx_op_t *op = p->ops.next; op != &p->ops; op = op->next)
        n += op->kind != CX_OPK_SUB && op->kind != CX_OPK_CHUNK; /* as cx_stats */
    return n;
}

static double ns_s(uint64_t ns)
{
    return (double)ns / 1e9;
}

static void engine_part(cx_engine_t *e, sb_t *b)
{
    cx_stats_t st;
    cx_stats_collect(e, &st);
    char u[CX_URL_MAX * 2], l[200];
    char lid[96];
    cx_lid_format(&e->lid, lid, sizeof lid);
    family(b, "connex_engine_info", "gauge", "This engine: its URL, LID, backends and incarnation.");
    sb_printf(b, "connex_engine_info{url=\"%s\",lid=\"%s\",backends=\"%s\",incarnation=\"%016llx\"} 1\n",
              esc(e->url, u, sizeof u), esc(lid, l, sizeof l), e->backends_str, (unsigned long long)e->incarnation);
    family(b, "connex_peers", "gauge", "Known peers by state.");
    const uint32_t by_state[] = { st.peers_connecting, st.peers_up, st.peers_suspect, st.peers_failed, st.peers_left };
    for (int s = 0; s < 5; s++) sb_printf(b, "connex_peers{state=\"%s\"} %u\n", state_names[s + 1], by_state[s]);
    one(b, "connex_regions", "gauge", "Memory regions registered here.", st.regions);
    one(b, "connex_registered_bytes", "gauge", "Bytes registered here.", st.registered_bytes);
    one(b, "connex_ops_in_flight", "gauge", "Ops initiated here and not completed.", st.ops_in_flight);
    one(b, "connex_failures_total", "counter", "FAILED events: peers that died, hung or were cut off.",
        st.peer_failures);
    one(b, "connex_joins_total", "counter", "JOINED events: known peers that came back.", st.peer_joins);
    one(b, "connex_op_timeouts_total", "counter", "Ops that ended with CX_ETIMEDOUT.", st.op_timeouts);
    per_op(b, "connex_ops_total", "counter", "Ops initiated here that completed ok.", st.ops);
    per_op(b, "connex_op_errors_total", "counter", "Ops initiated here that completed with an error.", st.op_errors);
    per_op(b, "connex_bytes_total", "counter", "Payload bytes of ok ops initiated here.", st.bytes);
    per_op(b, "connex_served_ops_total", "counter", "Requests served here as the target.", st.served_ops);
    per_op(b, "connex_served_bytes_total", "counter", "Bytes of requests served here as the target.", st.served_bytes);
    one(b, "connex_rejected_requests_total", "counter",
        "Target side: requests refused (out of bounds, unknown sender, garbage).", st.rejected_requests);
    one(b, "connex_msgs_queued", "gauge", "Messages waiting for cx_recv_msg.", st.msgs_queued);
    one(b, "connex_msgs_refused_total", "counter", "Messages refused with CX_EAGAIN: the queue was full.",
        st.msgs_refused);
    one(b, "connex_events_dropped_total", "counter", "Oldest events dropped because nobody read them.",
        st.events_dropped);
    one(b, "connex_auth_refused_total", "counter", "Connections refused by authentication.", st.auth_refused);
    family(b, "connex_staged_bytes_total", "counter", "Bytes moved through GPU staging, by direction.");
    sb_printf(b, "connex_staged_bytes_total{dir=\"h2d\"} %llu\nconnex_staged_bytes_total{dir=\"d2h\"} %llu\n",
              (unsigned long long)st.staged_h2d_bytes, (unsigned long long)st.staged_d2h_bytes);
    one(b, "connex_gpudirect", "gauge", "1 when GPU memory is registered with the NIC directly.",
        (uint64_t)st.gpudirect);
    one(b, "connex_steps_handed_over_total", "counter", "Group steps re-sent to another member after a failure.",
        st.steps_handed_over);
    one(b, "connex_steps_duplicates_dropped_total", "counter", "Group steps received twice and dropped.",
        st.steps_duplicates_dropped);
    one(b, "connex_directory_changes_total", "counter", "Directory entries added, moved or removed.",
        st.directory_changes);
    one(b, "connex_background_chunks_total", "counter", "Chunks of background-class transfers issued.",
        st.background_chunks);
    one(b, "connex_background_deferred_total", "counter", "Times a background chunk waited for critical ops.",
        st.background_deferred);
    one(b, "connex_ops_driven_total", "counter", "Ops a caller started on its own thread.", st.ops_driven);
}

static void peers_part(cx_engine_t *e, sb_t *b, uint64_t mono, double real)
{
    char l[200], u[CX_URL_MAX * 2], t[160];
    family(b, "connex_peer_info", "gauge", "A known peer: its URL, the pair's backend and transport.");
    for (cx_peer_t *p = e->peers; p; p = p->next) {
        int on = p->bidx >= 0 && p->bidx < e->nb && p->ep && (p->state == CX_PEER_UP || p->state == CX_PEER_SUSPECT);
        char tr[64] = "";
        if (on) cx_peer_transport(e, p, tr, sizeof tr);
        sb_printf(b, "connex_peer_info{peer=\"%s\",url=\"%s\",backend=\"%s\",transport=\"%s\",same_host=\"%d\"} 1\n",
                  esc(p->lid_str, l, sizeof l), esc(p->url, u, sizeof u), on ? e->bnames[p->bidx] : "",
                  esc(tr, t, sizeof t), p->same_host);
    }
    family(b, "connex_peer_state", "gauge", "1 for the peer's current state, 0 for the others.");
    for (cx_peer_t *p = e->peers; p; p = p->next)
        for (int s = CX_PEER_CONNECTING; s <= CX_PEER_LEFT; s++)
            sb_printf(b, "connex_peer_state{peer=\"%s\",state=\"%s\"} %d\n", esc(p->lid_str, l, sizeof l),
                      state_names[s], (int)p->state == s);
    family(b, "connex_peer_state_since_timestamp_seconds", "gauge",
           "Unix time of the last event about the peer (its state since then).");
    for (cx_peer_t *p = e->peers; p; p = p->next)
        if (p->m.since_ns)
            sb_printf(b, "connex_peer_state_since_timestamp_seconds{peer=\"%s\"} %.3f\n", esc(p->lid_str, l, sizeof l),
                      real - ns_s(mono - p->m.since_ns));
    family(b, "connex_peer_incarnation", "gauge", "The peer's current (or last) incarnation; 0 before any.");
    for (cx_peer_t *p = e->peers; p; p = p->next)
        sb_printf(b, "connex_peer_incarnation{peer=\"%s\"} %llu\n", esc(p->lid_str, l, sizeof l),
                  (unsigned long long)p->incarnation);
    family(b, "connex_peer_ops_in_flight", "gauge", "Ops bound to the peer, not completed.");
    for (cx_peer_t *p = e->peers; p; p = p->next)
        sb_printf(b, "connex_peer_ops_in_flight{peer=\"%s\"} %llu\n", esc(p->lid_str, l, sizeof l),
                  (unsigned long long)in_flight(p));
    family(b, "connex_peer_ops_total", "counter", "Ok ops initiated here to the peer.");
    for (cx_peer_t *p = e->peers; p; p = p->next)
        for (int k = 0; k < CX_OPK_COUNT; k++)
            sb_printf(b, "connex_peer_ops_total{peer=\"%s\",op=\"%s\"} %llu\n", esc(p->lid_str, l, sizeof l),
                      opk_names[k], (unsigned long long)p->m.ops[k]);
    family(b, "connex_peer_bytes_total", "counter", "Payload bytes of ok ops initiated here to the peer.");
    for (cx_peer_t *p = e->peers; p; p = p->next)
        for (int k = 0; k < CX_OPK_COUNT; k++)
            sb_printf(b, "connex_peer_bytes_total{peer=\"%s\",op=\"%s\"} %llu\n", esc(p->lid_str, l, sizeof l),
                      opk_names[k], (unsigned long long)p->m.bytes[k]);
    struct {
        const char *name, *help;
        size_t off;
    } cs[] = {
        { "connex_peer_op_errors_total", "Ops to the peer that ended with an error.",
          offsetof(cx_peer_metrics_t, errors) },
        { "connex_peer_op_timeouts_total", "Ops to the peer that ended with CX_ETIMEDOUT.",
          offsetof(cx_peer_metrics_t, timeouts) },
        { "connex_peer_failures_total", "FAILED events about the peer.", offsetof(cx_peer_metrics_t, failures) },
        { "connex_peer_joins_total", "JOINED events about the peer.", offsetof(cx_peer_metrics_t, joins) },
    };
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
        family(b, cs[i].name, "counter", cs[i].help);
        for (cx_peer_t *p = e->peers; p; p = p->next) {
            uint64_t v;
            memcpy(&v, (const char *)&p->m + cs[i].off, sizeof v);
            sb_printf(b, "%s{peer=\"%s\"} %llu\n", cs[i].name, esc(p->lid_str, l, sizeof l), (unsigned long long)v);
        }
    }
}

static void hist_part(cx_engine_t *e, sb_t *b)
{
    family(b, "connex_op_latency_seconds", "histogram",
           "Latency of ok ops initiated here (one in 8 timed), from the call to the completion.");
    for (int bi = 0; bi <= CX_MAX_BACKENDS; bi++) {
        if (bi >= e->nb && bi != CX_MAX_BACKENDS) continue;
        const char *bn = bi == CX_MAX_BACKENDS ? "none" : e->bnames[bi];
        for (int k = 0; k < CX_OPK_COUNT; k++) {
            const cx_hist_t *h = &e->hist[bi][k];
            if (bi == CX_MAX_BACKENDS && !h->count) continue; /* only ops that reached no backend */
            uint64_t cum = 0;
            for (int i = 0; i < CX_HIST_BUCKETS; i++) {
                cum += h->n[i];
                sb_printf(b, "connex_op_latency_seconds_bucket{op=\"%s\",backend=\"%s\",le=\"%s\"} %llu\n",
                          opk_names[k], bn, le_names[i], (unsigned long long)cum);
            }
            sb_printf(b, "connex_op_latency_seconds_bucket{op=\"%s\",backend=\"%s\",le=\"+Inf\"} %llu\n", opk_names[k],
                      bn, (unsigned long long)h->count);
            sb_printf(b, "connex_op_latency_seconds_sum{op=\"%s\",backend=\"%s\"} %.9f\n", opk_names[k], bn,
                      ns_s(h->sum_ns));
            sb_printf(b, "connex_op_latency_seconds_count{op=\"%s\",backend=\"%s\"} %llu\n", opk_names[k], bn,
                      (unsigned long long)h->count);
        }
    }
}

char *cx_metrics_render(cx_engine_t *e, size_t *len)
{
    sb_t b = { malloc(16384), 0, 16384, 0 };
    if (!b.p) return NULL;
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    double real = (double)rt.tv_sec + (double)rt.tv_nsec / 1e9;
    engine_part(e, &b);
    peers_part(e, &b, cx_now_ns(), real);
    hist_part(e, &b);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    *len = b.len;
    return b.p;
}

struct fmt_arg {
    char *text;
    size_t len;
};
static void format_fn(cx_engine_t *e, void *arg)
{
    struct fmt_arg *a = arg;
    a->text = cx_metrics_render(e, &a->len);
}

int cx_stats_format(cx_engine_t *e, char *buf, size_t len)
{
    if (!e || (len && !buf)) {
        cx_warn("cx_stats_format: %s", !e ? "no engine" : "buf is NULL");
        return CX_EINVAL;
    }
    struct fmt_arg a = { NULL, 0 };
    int rc = cx_exec(e, format_fn, &a);
    if (rc) return rc;
    if (!a.text) {
        cx_error("cx_stats_format: out of memory");
        return CX_ENOMEM;
    }
    if (a.len > (size_t)0x7fffffff) {
        free(a.text);
        return CX_ENOMEM;
    }
    if (len) {
        size_t n = a.len < len ? a.len : len - 1;
        memcpy(buf, a.text, n);
        buf[n] = 0;
    }
    free(a.text);
    return (int)a.len;
}
