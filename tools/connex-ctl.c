/* connex-ctl: the operator's view of a deployment.
 *
 *   connex-ctl [options] [list]     the directory (LID, URL, version) and, asked over its control
 *                                   port, each engine's peers: state, backend, incarnation, since
 *                                   when, failures, joins, ops in flight, errors, timeouts
 *   connex-ctl [options] watch      every engine's events as they happen (until killed, or
 *                                   --duration-ms), following engines that restart
 *
 * Options: --directory static|etcd://host:port (else CONNEX_DIRECTORY), --peers URL,... (the static
 * directory's members; else CONNEX_PEERS), --url URL (ask this engine too; repeatable),
 * --token-file FILE (else CONNEX_AUTH_TOKEN / CONNEX_AUTH_TOKEN_FILE), --json, --timeout-ms N
 * (per engine, default 2000), --duration-ms N (watch).
 *
 * Exit status: 0 when every engine answered, 3 when one did not (it is listed with why), 1 for
 * a usage or setup error. */
#include "ctl_client.h"
#include "json_str.h"

#include "connex/connex.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_ENGINES 1024

static const char *state_name(int s)
{
    static const char *n[] = { "unknown", "connecting", "up", "suspect", "failed", "left" };
    return s >= 0 && s <= 5 ? n[s] : "?";
}

static void iso_ms(uint64_t ms, char *out, size_t n)
{
    if (!ms) {
        snprintf(out, n, "-");
        return;
    }
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&t, &tm);
    size_t k = strftime(out, n, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + k, n - k, ".%03uZ", (unsigned)(ms % 1000));
}

typedef struct opts {
    const char *directory, *peers;
    const char *urls[64];
    int nurls;
    const char *token_file;
    int json, timeout_ms, duration_ms, watch;
} opts_t;

static int usage(void)
{
    fprintf(stderr,
            "usage: connex-ctl [--directory static|etcd://host:port] [--peers URL,...] [--url URL]...\n"
            "                  [--token-file FILE] [--json] [--timeout-ms N] [list | watch [--duration-ms N]]\n");
    return 1;
}

static int parse(int argc, char **argv, opts_t *o)
{
    memset(o, 0, sizeof *o);
    o->timeout_ms = 2000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "list")) continue;
        if (!strcmp(a, "watch")) {
            o->watch = 1;
            continue;
        }
        if (!strcmp(a, "--json")) {
            o->json = 1;
            continue;
        }
        if (!v) return -1;
        if (!strcmp(a, "--directory"))
            o->directory = v;
        else if (!strcmp(a, "--peers"))
            o->peers = v;
        else if (!strcmp(a, "--url") && o->nurls < 64)
            o->urls[o->nurls++] = v;
        else if (!strcmp(a, "--token-file"))
            o->token_file = v;
        else if (!strcmp(a, "--timeout-ms"))
            o->timeout_ms = atoi(v);
        else if (!strcmp(a, "--duration-ms"))
            o->duration_ms = atoi(v);
        else
            return -1;
        i++;
    }
    return o->timeout_ms > 0 ? 0 : -1;
}

static int load_token(const opts_t *o, cx_auth_t **auth)
{
    static cx_opts_t env; /* CONNEX_AUTH_TOKEN(_FILE): the environment, through the options table */
    if (cx_opts_load(&env) && (cx_opts_bad(&env, "CONNEX_AUTH_TOKEN") || cx_opts_bad(&env, "CONNEX_AUTH_TOKEN_FILE")))
        return CX_EINVAL;
    if (!o->token_file) return cx_auth_load(&env, NULL, auth);
    char buf[CX_AUTH_TOKEN_MAX + 2];
    int fd = open(o->token_file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "connex-ctl: %s: %s\n", o->token_file, strerror(errno));
        return CX_EINVAL;
    }
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0) n = 0;
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ')) n--;
    buf[n] = 0;
    int rc = cx_auth_load(&env, buf, auth);
    explicit_bzero(buf, sizeof buf);
    return rc;
}

typedef struct target {
    char lid[96], url[CX_URL_MAX];
    uint64_t version; /* directory version; 0: named on the command line */
} target_t;

/* The directory through an engine of our own (model connex-ctl, a LID per process), which the
 * listing leaves out. */
static int list_directory(const opts_t *o, target_t *t, int max, char *kind, size_t kn)
{
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = "connex-ctl";
    c.replica = (uint32_t)getpid();
    c.directory = o->directory;
    c.peers = o->peers;
    c.backend = "zmq"; /* the lightest to open; only the directory is used */
    cx_engine_t *e = NULL;
    int rc = cx_engine_create(&c, &e);
    if (rc == CX_EUNSUPPORTED) {
        c.backend = NULL;
        rc = cx_engine_create(&c, &e);
    }
    if (rc) {
        fprintf(stderr, "connex-ctl: cannot read the directory: %s\n", cx_strerror(rc));
        return rc;
    }
    snprintf(kind, kn, "%s", cx_directory_kind(e));
    static cx_dir_entry_t ents[MAX_ENGINES];
    int n = cx_directory_list(e, "*|*|*|*", ents, MAX_ENGINES);
    int k = 0;
    for (int i = 0; i < n && i < MAX_ENGINES && k < max; i++) {
        if (!strcmp(ents[i].lid.model, "connex-ctl")) continue;
        cx_lid_format(&ents[i].lid, t[k].lid, sizeof t[k].lid);
        snprintf(t[k].url, sizeof t[k].url, "%s", ents[i].url);
        t[k].version = ents[i].version;
        k++;
    }
    cx_engine_destroy(e);
    return n < 0 ? n : k;
}

static int add_urls(const opts_t *o, target_t *t, int k, int max)
{
    for (int i = 0; i < o->nurls && k < max; i++) {
        int dup = 0;
        for (int j = 0; j < k && !dup; j++) dup = !strcmp(t[j].url, o->urls[i]);
        if (dup) continue;
        cx_url_t u;
        char err[160];
        if (cx_url_parse(o->urls[i], &u, err, sizeof err)) {
            fprintf(stderr, "connex-ctl: --url %s: %s\n", o->urls[i], err);
            continue;
        }
        cx_lid_format(&u.lid, t[k].lid, sizeof t[k].lid);
        snprintf(t[k].url, sizeof t[k].url, "%s", o->urls[i]);
        t[k].version = 0;
        k++;
    }
    return k;
}

/* ---------------------------------------------------------------- list */

static int show_engine(const opts_t *o, const target_t *t, const cx_auth_t *auth, int first)
{
    cx_ctlc_t c;
    char why[256];
    int rc = cx_ctlc_open(&c, t->url, auth, CX_STATUS_PEERS, o->timeout_ms, why, sizeof why);
    uint8_t type = 0;
    size_t len = 0;
    if (!rc) rc = cx_ctlc_read(&c, o->timeout_ms, &type, &len, why, sizeof why);
    cx_wire_status_t s;
    if (!rc && (type != CX_CTL_STATUS_REPLY || cx_wire_get_status_head(c.body, len, &s))) {
        snprintf(why, sizeof why, "malformed status reply (frame %u)", type);
        rc = CX_EPEER;
    }
    if (o->json) {
        printf("%s\n    {\"lid\": ", first ? "" : ",");
        cx_json_str(stdout, t->lid);
        printf(", \"url\": ");
        cx_json_str(stdout, t->url);
        printf(", \"version\": %" PRIu64 ", \"reachable\": %s", t->version, rc ? "false" : "true");
    } else {
        printf("%-28s %-44s %7" PRIu64 "  ", t->lid, t->url, t->version);
    }
    if (rc) {
        if (o->json) {
            printf(", \"error\": ");
            cx_json_str(stdout, why);
            printf(", \"status\": ");
            cx_json_str(stdout, cx_strerror(rc));
            printf("}");
        } else {
            printf("UNREACHABLE (%s: %s)\n", cx_strerror(rc), why);
        }
        cx_ctlc_close(&c);
        return rc;
    }
    if (o->json) {
        printf(", \"incarnation\": \"%016" PRIx64 "\", \"backends\": ", s.incarnation);
        cx_json_str(stdout, s.backends);
        printf(", \"peers\": [");
    } else {
        printf("up  incarnation %016" PRIx64 "  backends %s  peers %u\n", s.incarnation, s.backends, s.npeers);
        if (s.npeers)
            printf("    %-26s %-10s %-9s %-16s %-16s %-24s %5s %5s %8s %6s %6s\n", "PEER", "STATE", "BACKEND",
                   "TRANSPORT", "INCARNATION", "SINCE", "FAIL", "JOIN", "INFLIGHT", "ERR", "TMO");
    }
    for (uint32_t i = 0; i < s.npeers; i++) {
        cx_wire_status_peer_t p;
        if (cx_wire_get_status_peer(&s.peers, &p)) {
            fprintf(stderr, "connex-ctl: %s: malformed peer entry %u\n", t->url, i);
            break;
        }
        char since[40];
        iso_ms(p.since_ms, since, sizeof since);
        if (o->json) {
            printf("%s\n      {\"lid\": ", i ? "," : "");
            cx_json_str(stdout, p.lid);
            printf(", \"url\": ");
            cx_json_str(stdout, p.url);
            printf(", \"state\": \"%s\", \"backend\": ", state_name(p.state));
            cx_json_str(stdout, p.backend);
            printf(", \"transport\": ");
            cx_json_str(stdout, p.transport);
            printf(", \"incarnation\": \"%016" PRIx64 "\", \"since\": ", p.incarnation);
            if (p.since_ms)
                cx_json_str(stdout, since);
            else
                printf("null");
            printf(", \"since_ms\": %" PRIu64 ", \"failures\": %" PRIu64 ", \"joins\": %" PRIu64
                   ", \"ops_in_flight\": %" PRIu64 ", \"op_errors\": %" PRIu64 ", \"op_timeouts\": %" PRIu64 "}",
                   p.since_ms, p.failures, p.joins, p.in_flight, p.errors, p.timeouts);
        } else {
            printf("    %-26s %-10s %-9s %-16s %016" PRIx64 " %-24s %5" PRIu64 " %5" PRIu64 " %8" PRIu64 " %6" PRIu64
                   " %6" PRIu64 "\n",
                   p.lid, state_name(p.state), p.backend[0] ? p.backend : "-", p.transport[0] ? p.transport : "-",
                   p.incarnation, since, p.failures, p.joins, p.in_flight, p.errors, p.timeouts);
        }
    }
    if (o->json) printf("\n    ]}");
    cx_ctlc_close(&c);
    return CX_OK;
}

static int run_list(const opts_t *o, const cx_auth_t *auth, target_t *t, int n, const char *kind)
{
    int bad = 0;
    if (o->json) {
        printf("{\"directory\": ");
        cx_json_str(stdout, kind);
        printf(", \"engines\": [");
    } else {
        printf("directory: %s, %d engine%s\n", kind, n, n == 1 ? "" : "s");
        printf("%-28s %-44s %7s  %s\n", "LID", "URL", "VERSION", "STATUS");
    }
    for (int i = 0; i < n; i++) bad |= show_engine(o, &t[i], auth, i == 0) != CX_OK;
    if (o->json) printf("\n]}\n");
    fflush(stdout);
    return bad ? 3 : 0;
}

/* ---------------------------------------------------------------- watch */

typedef struct watched {
    target_t t;
    cx_ctlc_t c;
    int open;
    uint64_t retry_ms;
} watched_t;

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void say(const opts_t *o, const char *engine, const char *what, const char *peer, uint64_t inc, uint64_t ms,
                const char *reason)
{
    char when[40];
    iso_ms(ms, when, sizeof when);
    if (o->json) {
        printf("{\"time\": \"%s\", \"engine\": ", when);
        cx_json_str(stdout, engine);
        printf(", \"event\": \"%s\", \"peer\": ", what);
        cx_json_str(stdout, peer);
        printf(", \"incarnation\": \"%016" PRIx64 "\", \"reason\": ", inc);
        cx_json_str(stdout, reason);
        printf("}\n");
    } else {
        printf("%s %-24s %-8s %-24s %016" PRIx64 " %s\n", when, engine, what, peer, inc, reason);
    }
    fflush(stdout);
}

static uint64_t real_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void watch_connect(const opts_t *o, const cx_auth_t *auth, watched_t *w)
{
    char why[256];
    int rc = cx_ctlc_open(&w->c, w->t.url, auth, CX_STATUS_WATCH, o->timeout_ms, why, sizeof why);
    uint8_t type = 0;
    size_t len = 0;
    cx_wire_status_t s;
    if (!rc) rc = cx_ctlc_read(&w->c, o->timeout_ms, &type, &len, why, sizeof why);
    if (!rc && (type != CX_CTL_STATUS_REPLY || cx_wire_get_status_head(w->c.body, len, &s))) rc = CX_EPEER;
    if (rc) {
        cx_ctlc_close(&w->c);
        w->retry_ms = mono_ms() + 1000;
        if (w->open != -1) say(o, w->t.lid, "unreachable", "-", 0, real_ms(), why);
        w->open = -1; /* said once until it answers */
        return;
    }
    w->open = 1;
    char r[320];
    snprintf(r, sizeof r, "%s, %u peers, backends %s", s.url, s.npeers, s.backends);
    say(o, w->t.lid, "watching", "-", s.incarnation, s.now_ms, r);
}

static int run_watch(const opts_t *o, const cx_auth_t *auth, target_t *t, int n)
{
    watched_t *w = calloc((size_t)n, sizeof *w);
    if (!w) return 1;
    for (int i = 0; i < n; i++) {
        w[i].t = t[i];
        w[i].c.fd = -1;
        watch_connect(o, auth, &w[i]);
    }
    uint64_t end = o->duration_ms > 0 ? mono_ms() + (uint64_t)o->duration_ms : 0;
    struct pollfd *pf = calloc((size_t)n, sizeof *pf);
    while (pf && (!end || mono_ms() < end)) {
        for (int i = 0; i < n; i++) {
            pf[i].fd = w[i].open == 1 ? w[i].c.fd : -1;
            pf[i].events = POLLIN;
            pf[i].revents = 0;
        }
        int wait = 200;
        if (end && end - mono_ms() < (uint64_t)wait) wait = (int)(end - mono_ms());
        if (poll(pf, (nfds_t)n, wait) < 0 && errno != EINTR) break;
        for (int i = 0; i < n; i++) {
            if (w[i].open != 1) {
                if (mono_ms() >= w[i].retry_ms) watch_connect(o, auth, &w[i]);
                continue;
            }
            if (!pf[i].revents) continue;
            uint8_t type;
            size_t len;
            char why[256];
            int rc = cx_ctlc_read(&w[i].c, o->timeout_ms, &type, &len, why, sizeof why);
            cx_wire_status_event_t ev;
            if (!rc && type == CX_CTL_STATUS_EVENT && !cx_wire_get_status_event(w[i].c.body, len, &ev)) {
                say(o, w[i].t.lid, cx_event_name((cx_event_type_t)ev.type), ev.lid, ev.incarnation, ev.time_ms,
                    ev.reason);
                continue;
            }
            if (!rc) snprintf(why, sizeof why, "unexpected frame %u", type);
            say(o, w[i].t.lid, "lost", "-", 0, real_ms(), why);
            cx_ctlc_close(&w[i].c);
            w[i].open = 0;
            w[i].retry_ms = mono_ms() + 200;
        }
    }
    for (int i = 0; i < n; i++) cx_ctlc_close(&w[i].c);
    free(pf);
    free(w);
    return 0;
}

int main(int argc, char **argv)
{
    opts_t o;
    if (parse(argc, argv, &o)) return usage();
    cx_auth_t *auth = NULL;
    if (load_token(&o, &auth)) return 1;
    static target_t t[MAX_ENGINES];
    char kind[16] = "none";
    int n = 0;
    if (o.directory || o.peers || getenv("CONNEX_DIRECTORY") || getenv("CONNEX_PEERS") || !o.nurls) {
        n = list_directory(&o, t, MAX_ENGINES, kind, sizeof kind);
        if (n < 0) {
            cx_auth_free(auth);
            return 1;
        }
    }
    n = add_urls(&o, t, n, MAX_ENGINES);
    int rc = o.watch ? run_watch(&o, auth, t, n) : run_list(&o, auth, t, n, kind);
    cx_auth_free(auth);
    return rc;
}
