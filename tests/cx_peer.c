/* cx_peer: the other process of the conformance tests.
 *
 * Creates one engine, registers one region filled with cxt_pat(seed, i), prints
 *   READY <url> <region addr, hex> <region len>
 * and then obeys one command per stdin line, answering each with one "OK ..." or "ERR <rc> ..."
 * line. Events and messages are printed as they happen, by their own threads:
 *   EVENT <name> <lid> <incarnation hex> <reason>
 *   MSG <from lid> <len> <hash hex> [CHK OK | CHK BAD <why>] [STEP <id> <sender incarnation hex>]
 * A message "CHK <addr> <len> <hash>" (what put_signal senders put in it) is checked against the
 * region the moment it is received: that is how a test sees a signal overtaking its data.
 *
 * Commands (addresses may be hex with 0x, offsets are into this peer's region):
 *   READ <peer> <raddr> <len> <loff>     OK <hash of the bytes read>
 *   WRITE <peer> <raddr> <len> <loff>    OK
 *   PUTSIG <peer> <raddr> <len> <loff>   OK   (message: CHK <raddr> <len> <hash>)
 *   READLOOP <peer> <raddr> <len> <max reads> <max ms> <seed>
 *                                        reads [raddr, +len) into the region's start again and
 *                                        again until a read fails, max reads or max ms, checking
 *                                        each against cxt_pat(seed, i); prints LOOP 1 after the
 *                                        first read completed, then OK reads=<done with 0>
 *                                        bad=<of them, not the pattern> first_bad=<that read's
 *                                        index or -1> off=<its first wrong byte's offset>
 *                                        byte=<that byte, hex> rc=<the read that ended it, or 0>
 *   SEND <peer> <len> <seed>             OK   (message bytes: cxt_pat(seed, i))
 *   FILL <seed>                          OK   (refill the region)
 *   HASH <off> <len>                     OK <hash>
 *   CONNECT <url> <timeout ms>           OK
 *   STATS                                OK regions=.. peers_up=.. failed=.. inflight=.. ... dup_steps=..
 *   RING                                 OK slots=.. free=.. jobs=.. subs=.. served=.. queued=.. ranges=..
 *                                          inline=.. lent=..
 *                                        (its staging rings and the ranges it stages for peers)
 *   XREG <len> <seed>                    OK <addr hex>: a second region of host memory, filled
 *                                        with cxt_pat(seed, i) and registered (at most 8 at once)
 *   XUNREG <addr>                        OK once cx_unregister_memory returned; the memory is then
 *                                        unmapped at once, so that a byte of a peer that still
 *                                        reached it would kill this process
 *   QUIT                                 OK, then a clean close (BYE) and exit 0
 *   DIE <signal> / EXIT <status>         dies on that signal / exits with that status at once
 * The region is host memory, or device memory with --mem sim|cuda (default: CONNEX_TEST_MEM);
 * FILL, HASH and the checks reach it through cxt_mem.h, so every command works on every kind.
 * End of stdin also closes cleanly, so a test that dies leaves no peer behind. */
#include "cxt.h"
#include "cxt_mem.h"
#include "staging.h" /* RING: cx_staging_debug */

#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <signal.h>
#include <unistd.h>

static cx_engine_t *g_e;
static uint8_t *g_reg;
static size_t g_len;
static int g_kind = CX_MEM_HOST;
static atomic_int g_stop;
static pthread_mutex_t g_out = PTHREAD_MUTEX_INITIALIZER;

static struct {
    uint8_t *p;
    size_t len;
} g_x[8]; /* XREG's regions */

static void out(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void out(const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&g_out);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
    pthread_mutex_unlock(&g_out);
}

static void *event_thread(void *arg)
{
    (void)arg;
    while (!atomic_load(&g_stop)) {
        cx_event_t ev;
        if (cx_wait_event(g_e, &ev, 100) != CX_OK) continue;
        char l[CX_URL_MAX];
        cx_lid_format(&ev.peer, l, sizeof l);
        out("EVENT %s %s %" PRIx64 " %s", cx_event_name(ev.type), l, ev.incarnation, ev.reason[0] ? ev.reason : "-");
    }
    return NULL;
}

/* Checks "CHK <addr> <len> <hash>" against the region right now. */
static void check_signal(const cx_msg_t *m, char *res, size_t n)
{
    char txt[128];
    size_t c = m->len < sizeof txt - 1 ? m->len : sizeof txt - 1;
    memcpy(txt, m->data, c);
    txt[c] = 0;
    unsigned long long addr, len, h;
    if (sscanf(txt, "CHK %llx %llu %llx", &addr, &len, &h) != 3) {
        res[0] = 0;
        return;
    }
    uint64_t base = (uint64_t)(uintptr_t)g_reg;
    if (addr < base || len > g_len || addr - base > g_len - len) {
        snprintf(res, n, " CHK BAD outside-region");
        return;
    }
    uint64_t got = cxt_mem_hash(g_reg + (addr - base), len);
    if (got == h)
        snprintf(res, n, " CHK OK");
    else
        snprintf(res, n, " CHK BAD hash %" PRIx64 " expected %llx", got, h);
}

static void *msg_thread(void *arg)
{
    (void)arg;
    while (!atomic_load(&g_stop)) {
        cx_msg_t m;
        if (cx_recv_msg(g_e, &m, 100) != CX_OK) continue;
        char chk[160];
        check_signal(&m, chk, sizeof chk);
        char l[CX_URL_MAX];
        cx_lid_format(&m.from, l, sizeof l);
        char step[64] = "";
        if (m.step) snprintf(step, sizeof step, " STEP %" PRIu64 " %" PRIx64, m.step, m.from_incarnation);
        out("MSG %s %zu %" PRIx64 "%s%s", l, m.len, cxt_hash(m.data, m.len), chk, step);
        cx_msg_release(&m);
    }
    return NULL;
}

static int in_region(uint64_t off, uint64_t len)
{
    return off <= g_len && len <= g_len - off;
}

static void reply(int rc, const char *okfmt, ...) __attribute__((format(printf, 2, 3)));
static void reply(int rc, const char *okfmt, ...)
{
    if (rc) {
        out("ERR %d %s", rc, cx_strerror(rc));
        return;
    }
    char b[512];
    va_list ap;
    va_start(ap, okfmt);
    vsnprintf(b, sizeof b, okfmt, ap);
    va_end(ap);
    out("OK%s%s", b[0] ? " " : "", b);
}

static int num(const char *t, unsigned long long *v)
{
    char *end;
    if (!t || !*t) return -1;
    *v = strtoull(t, &end, 0);
    return *end ? -1 : 0;
}

static void command(char *line)
{
    char *tok[8] = { 0 };
    int nt = 0;
    for (char *sp, *t = strtok_r(line, " ", &sp); t && nt < 8; t = strtok_r(NULL, " ", &sp)) tok[nt++] = t;
    if (nt == 0) return;
    const char *cmd = tok[0], *peer = tok[1];
    unsigned long long a = 0, b = 0, c = 0;
    if (!strcmp(cmd, "READ") || !strcmp(cmd, "WRITE") || !strcmp(cmd, "PUTSIG")) {
        if (nt != 5 || num(tok[2], &a) || num(tok[3], &b) || num(tok[4], &c) || !in_region(c, b)) {
            out("ERR %d usage: %s <peer> <raddr> <len> <loff inside the region>", CX_EINVAL, cmd);
            return;
        }
        uint8_t *loc = g_reg + c;
        int rc;
        if (cmd[0] == 'R') {
            rc = cx_read(g_e, peer, loc, a, b);
            reply(rc, "%" PRIx64, rc ? 0 : cxt_mem_hash(loc, b));
        } else if (cmd[0] == 'W') {
            reply(cx_write(g_e, peer, loc, a, b), "%s", "");
        } else {
            char msg[128];
            snprintf(msg, sizeof msg, "CHK %llx %llu %" PRIx64, a, b, cxt_mem_hash(loc, b));
            cx_op_t *op = NULL;
            rc = cx_put_signal(g_e, peer, loc, a, b, msg, strlen(msg), &op);
            if (rc == CX_OK) rc = cx_op_wait(op, -1);
            reply(rc, "%s", "");
        }
    } else if (!strcmp(cmd, "READLOOP")) {
        unsigned long long max, ms, seed;
        if (nt != 7 || num(tok[2], &a) || num(tok[3], &b) || num(tok[4], &max) || num(tok[5], &ms) ||
            num(tok[6], &seed) || !in_region(0, b)) {
            out("ERR %d usage: READLOOP <peer> <raddr> <len inside the region> <max reads> <max ms> <seed>", CX_EINVAL);
            return;
        }
        uint64_t t0 = cxt_now_ns();
        long long reads = 0, bad = 0, first_bad = -1, off = -1;
        unsigned byte = 0;
        int rc = 0;
        for (unsigned long long i = 0; i < max && cxt_ms_since(t0) < (double)ms; i++) {
            rc = cx_read(g_e, peer, g_reg, a, b);
            if (rc) break;
            long long at = cxt_mem_check(g_reg, b, (uint32_t)seed, 0);
            if (at >= 0) {
                if (first_bad < 0) {
                    first_bad = reads;
                    off = at;
                    byte = cxt_mem_byte(g_reg + at);
                }
                bad++;
            }
            if (reads++ == 0) out("LOOP 1");
        }
        reply(0, "reads=%lld bad=%lld first_bad=%lld off=%lld byte=%02x rc=%d", reads, bad, first_bad, off, byte, rc);
    } else if (!strcmp(cmd, "SEND")) {
        if (nt != 4 || num(tok[2], &a) || num(tok[3], &b) || a > CX_MSG_MAX + 1ull) {
            out("ERR %d usage: SEND <peer> <len> <seed>", CX_EINVAL);
            return;
        }
        uint8_t *m = malloc(a ? a : 1);
        if (!m) {
            reply(CX_ENOMEM, "%s", "");
            return;
        }
        cxt_fill(m, a, (uint32_t)b, 0);
        reply(cx_send_msg(g_e, peer, m, a), "%s", "");
        free(m);
    } else if (!strcmp(cmd, "FILL")) {
        if (nt != 2 || num(tok[1], &a)) {
            out("ERR %d usage: FILL <seed>", CX_EINVAL);
            return;
        }
        reply(cxt_mem_fill(g_reg, g_len, (uint32_t)a, 0) ? CX_ERR : 0, "%s", "");
    } else if (!strcmp(cmd, "HASH")) {
        if (nt != 3 || num(tok[1], &a) || num(tok[2], &b) || !in_region(a, b)) {
            out("ERR %d usage: HASH <off> <len> inside the region", CX_EINVAL);
            return;
        }
        reply(0, "%" PRIx64, cxt_mem_hash(g_reg + a, b));
    } else if (!strcmp(cmd, "CONNECT")) {
        if (nt != 3 || num(tok[2], &a)) {
            out("ERR %d usage: CONNECT <url> <ms>", CX_EINVAL);
            return;
        }
        reply(cx_connect(g_e, peer, (int)a), "%s", "");
    } else if (!strcmp(cmd, "XREG")) {
        size_t k = 0;
        while (k < 8 && g_x[k].p) k++;
        if (nt != 3 || num(tok[1], &a) || num(tok[2], &b) || !a || k == 8) {
            out("ERR %d usage: XREG <len> <seed> (at most 8 at once)", CX_EINVAL);
            return;
        }
        void *m = mmap(NULL, a, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            reply(CX_ENOMEM, "%s", "");
            return;
        }
        cxt_fill(m, a, (uint32_t)b, 0);
        int rc = cx_register_memory(g_e, m, a);
        if (rc) {
            munmap(m, a);
            reply(rc, "%s", "");
            return;
        }
        g_x[k].p = m;
        g_x[k].len = a;
        reply(0, "%" PRIxPTR, (uintptr_t)m);
    } else if (!strcmp(cmd, "XUNREG")) {
        size_t k = 0;
        while (k < 8 && (!g_x[k].p || nt != 2 || num(tok[1], &a) || (uintptr_t)g_x[k].p != a)) k++;
        if (k == 8) {
            out("ERR %d usage: XUNREG <addr of an XREG region>", CX_EINVAL);
            return;
        }
        int rc = cx_unregister_memory(g_e, g_x[k].p);
        if (rc == CX_OK) { /* a timed-out unregister leaves the memory mapped: it may still be reached */
            munmap(g_x[k].p, g_x[k].len);
            g_x[k].p = NULL;
        }
        reply(rc, "%s", "");
    } else if (!strcmp(cmd, "STATS")) {
        cx_stats_t st;
        int rc = cx_stats(g_e, &st);
        reply(rc,
              "regions=%" PRIu64 " peers_up=%u failed=%u left=%u inflight=%" PRIu64 " rejected=%" PRIu64
              " staged_h2d=%" PRIu64 " staged_d2h=%" PRIu64 " gpudirect=%d dup_steps=%" PRIu64,
              st.regions, st.peers_up, st.peers_failed, st.peers_left, st.ops_in_flight, st.rejected_requests,
              st.staged_h2d_bytes, st.staged_d2h_bytes, st.gpudirect, st.steps_duplicates_dropped);
    } else if (!strcmp(cmd, "RING")) {
        cx_staging_debug_t d;
        int rc = cx_staging_debug(g_e, &d);
        reply(rc, "slots=%u free=%u jobs=%d subs=%u served=%u queued=%u ranges=%u inline=%" PRIu64 " lent=%" PRIu64,
              d.slots, d.slots_free, d.jobs, d.subs, d.served, d.queued, d.ranges, d.inline_ranges, d.chunks_lent);
    } else {
        out("ERR %d unknown command '%s'", CX_EINVAL, cmd);
    }
}

static void usage(void)
{
    fprintf(stderr,
            "usage: cx_peer --model M --stage N --shard N --replica N [--port P] [--hb MS]\n"
            "       [--hb-timeout MS] [--op-timeout MS] [--region BYTES] [--seed N] [--connect URL]\n"
            "       [--listen IP] [--mem host|sim|cuda] [--ballast MIB]\n"
            "       [--host-id ID]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    cx_config_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.model = "peer";
    size_t region = 1 << 20, ballast = 0;
    uint32_t seed = 1;
    const char *connect_url = NULL;
    g_kind = cxt_mem_env(CX_MEM_HOST);
    static const struct option opts[] = {
        { "model", 1, 0, 'm' },  { "stage", 1, 0, 's' },   { "shard", 1, 0, 'd' },      { "replica", 1, 0, 'r' },
        { "port", 1, 0, 'p' },   { "hb", 1, 0, 'h' },      { "hb-timeout", 1, 0, 't' }, { "op-timeout", 1, 0, 'o' },
        { "region", 1, 0, 'g' }, { "seed", 1, 0, 'x' },    { "connect", 1, 0, 'c' },    { "listen", 1, 0, 'l' },
        { "mem", 1, 0, 'k' },    { "ballast", 1, 0, 'b' }, { "host-id", 1, 0, 'H' },    { 0, 0, 0, 0 }
    };
    int ch;
    while ((ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        unsigned long v = optarg ? strtoul(optarg, NULL, 0) : 0;
        switch (ch) {
        case 'm': cfg.model = optarg; break;
        case 's': cfg.stage = (uint32_t)v; break;
        case 'd': cfg.shard = (uint32_t)v; break;
        case 'r': cfg.replica = (uint32_t)v; break;
        case 'p': cfg.port = (uint16_t)v; break;
        case 'h': cfg.heartbeat_ms = (uint32_t)v; break;
        case 't': cfg.heartbeat_timeout_ms = (uint32_t)v; break;
        case 'o': cfg.op_timeout_ms = (uint32_t)v; break;
        case 'g': region = v; break;
        case 'x': seed = (uint32_t)v; break;
        case 'c': connect_url = optarg; break;
        case 'l': cfg.listen_ip = optarg; break;
        case 'k': g_kind = cxt_mem_parse(optarg); break;
        case 'b': ballast = v << 20; break;
        case 'H': setenv("CONNEX_HOST_ID", optarg, 1); break; /* before the engine probes */
        default: usage();
        }
    }
    if (region == 0 || g_kind < 0) usage();
    /* Touched memory that is not registered: a process that holds a lot, so that its kill -9
     * takes a while (the kernel unmaps it before closing the sockets). */
    if (ballast) {
        void *b = mmap(NULL, ballast, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (b == MAP_FAILED) {
            fprintf(stderr, "cx_peer: no %zu bytes of ballast\n", ballast);
            return 1;
        }
        memset(b, 1, ballast);
    }
    cxt_apply_test_env(&cfg);
    int rc = cx_engine_create(&cfg, &g_e);
    if (rc) {
        fprintf(stderr, "cx_peer: cx_engine_create: %s\n", cx_strerror(rc));
        printf("FAIL create %d\n", rc);
        return 1;
    }
    g_reg = cxt_mem_alloc(g_kind, region);
    if (!g_reg) {
        fprintf(stderr, "cx_peer: no %zu bytes of %s memory\n", region, cxt_mem_name(g_kind));
        return 1;
    }
    g_len = region;
    if (cxt_mem_fill(g_reg, g_len, seed, 0)) {
        fprintf(stderr, "cx_peer: cannot fill the region\n");
        return 1;
    }
    if ((rc = cx_register_memory(g_e, g_reg, g_len))) {
        fprintf(stderr, "cx_peer: register: %s\n", cx_strerror(rc));
        return 1;
    }
    pthread_t te, tm;
    pthread_create(&te, NULL, event_thread, NULL);
    pthread_create(&tm, NULL, msg_thread, NULL);
    if (connect_url && (rc = cx_connect(g_e, connect_url, 5000)))
        fprintf(stderr, "cx_peer: connect %s: %s (continuing)\n", connect_url, cx_strerror(rc));
    out("READY %s %" PRIxPTR " %zu", cx_engine_local_url(g_e), (uintptr_t)g_reg, g_len);

    char line[1024];
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\r\n")] = 0;
        if (!strcmp(line, "QUIT")) {
            out("OK");
            break;
        }
        /* How a peer ends badly, for the harness's own test (unit_cxt_peer): at once, no
         * cleanup, no reply. */
        int n;
        if (sscanf(line, "DIE %d", &n) == 1) {
            signal(n, SIG_DFL);
            raise(n);
            _exit(99);
        }
        if (sscanf(line, "EXIT %d", &n) == 1) _exit(n);
        command(line);
    }
    atomic_store(&g_stop, 1);
    pthread_join(te, NULL);
    pthread_join(tm, NULL);
    cx_engine_destroy(g_e);
    cxt_mem_free(g_kind, g_reg, g_len);
    return 0;
}
