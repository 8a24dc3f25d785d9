/* Replica groups end to end, real processes on loopback: this process is the sender, the
 * replicas are tests/cx_peer processes (model "m", stage 1) that print each step they queue
 * ("MSG ... STEP <id> <sender incarnation>").
 *
 * The directory comes from CXT_DIRECTORY (default "static": the replicas are given to the group
 * with cx_group_add). Any other value (say etcd://127.0.0.1:2379) is exported as CONNEX_DIRECTORY
 * for this engine and the replicas, and the group learns its members from the directory alone.
 * Every wait is bounded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cxt.h"
#include "cxt_etcd.h"

#define PATTERN "m|1|*|*"
#define CONNECT_MS 2000

static int g_static = 1;

typedef struct fx {
    cx_engine_t *e;
    cx_group_t *g;
    cxt_peer_t r[2]; /* replica 0 ("A") and 1 ("B") */
} fx_t;

static void peer_init(cxt_peer_t *p)
{
    memset(p, 0, sizeof *p);
    p->pid = -1;
    p->in_fd = p->out_fd = -1;
}

static uint32_t g_hb = 200, g_hbt = 1000; /* the current test's heartbeat (fx_up) */

static int start_replica(fx_t *f, int i, uint16_t port, const char *connect)
{
    cxt_peer_opts_t o = { .model = "m",
                          .stage = 1,
                          .replica = (uint32_t)i,
                          .port = port,
                          .hb_ms = g_hb,
                          .hb_timeout_ms = g_hbt,
                          .connect = connect };
    peer_init(&f->r[i]);
    if (cxt_peer_start(&f->r[i], &o, 10000)) return -1;
    if (g_static && cx_group_add(f->g, f->r[i].url)) return -1;
    return 0;
}

/* SIGSTOP, and wait until every thread of it is stopped (kill only asks): a step sent right
 * after must find it hung, not still reading. */
static void stop_peer(cxt_peer_t *p)
{
    kill(p->pid, SIGSTOP);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)p->pid);
    for (int i = 0; i < 500; i++) {
        FILE *fp = fopen(path, "r");
        char st = 0;
        if (fp) {
            int c;
            while ((c = fgetc(fp)) != EOF && c != ')') {} /* skip "pid (comm" */
            if (fscanf(fp, " %c", &st) != 1) st = 0;
            fclose(fp);
        }
        if (st == 'T' || st == 't') {
            usleep(20000); /* the other threads follow the main one within microseconds */
            return;
        }
        usleep(2000);
    }
    fprintf(stderr, "peer %d did not stop within 1 s\n", (int)p->pid);
}

static cx_peer_state_t member_state(fx_t *f, const char *lid)
{
    cx_lid_t lids[8];
    cx_peer_state_t st[8];
    int n = cx_group_members(f->g, lids, st, 8);
    for (int i = 0; i < n && i < 8; i++) {
        char l[96];
        cx_lid_format(&lids[i], l, sizeof l);
        if (!strcmp(l, lid)) return st[i];
    }
    return CX_PEER_UNKNOWN;
}

static int wait_member(fx_t *f, const char *lid, cx_peer_state_t want, int timeout_ms)
{
    uint64_t t0 = cxt_now_ns();
    while (cxt_ms_since(t0) < timeout_ms) {
        if (member_state(f, lid) == want) return 0;
        usleep(10000);
    }
    fprintf(stderr, "member %s: state %d, wanted %d after %d ms\n", lid, member_state(f, lid), want, timeout_ms);
    return -1;
}

/* The next step line this replica printed: its id (0 when none came). */
static uint64_t next_step(cxt_peer_t *p, int timeout_ms, uint64_t *hash)
{
    char line[1024];
    if (cxt_peer_expect(p, "MSG ", timeout_ms, line, sizeof line)) return 0;
    const char *s = strstr(line, " STEP ");
    unsigned long long id = 0;
    if (!s || sscanf(s, " STEP %llu", &id) != 1) {
        fprintf(stderr, "not a step: %s\n", line);
        return 0;
    }
    if (hash) {
        char lid[96];
        size_t len;
        unsigned long long h;
        if (sscanf(line, "MSG %95s %zu %llx", lid, &len, &h) == 3) *hash = h;
    }
    return id;
}

/* Sends one step, waits for it, says who took it; checks that replica printed it. */
static int send_step(fx_t *f, const char *text, uint64_t *id_out)
{
    cx_op_t *op;
    assert_int_equal(cx_group_send(f->g, text, strlen(text), &op), CX_OK);
    cx_lid_t by;
    uint64_t id = 0;
    assert_int_equal(cx_group_wait(op, 10000, &by, &id), CX_OK);
    assert_true(id > 0);
    int who = (int)by.replica;
    assert_true(who == 0 || who == 1);
    uint64_t h = 0;
    assert_int_equal(next_step(&f->r[who], 5000, &h), id);
    assert_int_equal(h, cxt_hash(text, strlen(text)));
    if (id_out) *id_out = id;
    return who;
}

static void fx_up(fx_t *f, uint32_t hb, uint32_t hbt)
{
    g_hb = hb;
    g_hbt = hbt;
    memset(f, 0, sizeof *f);
    peer_init(&f->r[0]);
    peer_init(&f->r[1]);
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = "m";
    c.heartbeat_ms = hb;
    c.heartbeat_timeout_ms = hbt;
    c.op_timeout_ms = 10000;
    c.connect_timeout_ms = CONNECT_MS;
    cxt_apply_test_env(&c);
    assert_int_equal(cx_engine_create(&c, &f->e), CX_OK);
    assert_int_equal(cx_group_open(f->e, PATTERN, CX_PICK_ROUND_ROBIN, &f->g), CX_OK);
    assert_int_equal(start_replica(f, 0, 0, NULL), 0);
    assert_int_equal(start_replica(f, 1, 0, NULL), 0);
    assert_int_equal(wait_member(f, "m|1|0|0", CX_PEER_UP, 5000), 0);
    assert_int_equal(wait_member(f, "m|1|0|1", CX_PEER_UP, 5000), 0);
    /* One plain message each first: some backends set their data connection up on first use,
     * and on libfabric (rxm) a first message to a hung process stalls the others until that
     * process is declared failed; the tests hang replicas on purpose. */
    for (int i = 0; i < 2; i++) {
        char line[1024];
        assert_int_equal(cx_send_msg(f->e, f->r[i].url, "warm", 4), CX_OK);
        assert_int_equal(cxt_peer_expect(&f->r[i], "MSG ", 5000, line, sizeof line), 0);
    }
}

static void fx_down(fx_t *f)
{
    cxt_peer_crash(&f->r[0]);
    cxt_peer_crash(&f->r[1]);
    cx_group_close(f->g);
    cx_engine_destroy(f->e);
}

/* The seeds' scenario: kill a replica with a step in flight, rejoin, migrate, scale down. */
static void test_scenario(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f, 200, 1000);
    cx_stats_t st;
    int seen[2] = { 0, 0 };
    for (int i = 0; i < 4; i++) seen[send_step(&f, "warm-up", NULL)]++;
    assert_true(seen[0] > 0 && seen[1] > 0); /* round robin uses both */

    /* 1. A hangs with a step in flight, then dies: the step completes on B. */
    cx_lid_t next;
    assert_int_equal(cx_group_pick(f.g, &next), CX_OK);
    if (next.replica == 1) send_step(&f, "to B first", NULL);
    assert_int_equal(cx_group_pick(f.g, &next), CX_OK);
    assert_int_equal(next.replica, 0);
    stop_peer(&f.r[0]);
    const char *text = "the step in flight";
    cx_op_t *op;
    assert_int_equal(cx_group_send(f.g, text, strlen(text), &op), CX_OK);
    cx_lid_t by;
    uint64_t id = 0;
    int early = cx_group_wait(op, 150, &by, &id);
    if (early != CX_EINPROGRESS)
        fprintf(stderr, "step %" PRIu64 " done early (%d) by replica %u\n", id, early, by.replica);
    assert_int_equal(early, CX_EINPROGRESS); /* A is stopped: not yet */
    cxt_peer_signal(&f.r[0], SIGKILL);       /* no SIGCONT first: A must not run again */
    cxt_peer_crash(&f.r[0]);
    uint64_t t0 = cxt_now_ns();
    assert_int_equal(cx_group_wait(op, 5000, &by, &id), CX_OK);
    fprintf(stderr, "step %" PRIu64 " handed over to replica %u in %.1f ms after the kill\n", id, by.replica,
            cxt_ms_since(t0));
    assert_int_equal(by.replica, 1);
    assert_int_equal(next_step(&f.r[1], 5000, NULL), id);
    assert_int_equal(cx_stats(f.e, &st), CX_OK);
    assert_int_equal(st.steps_handed_over, 1);
    assert_int_equal(wait_member(&f, "m|1|0|0", CX_PEER_FAILED, 3000), 0);
    for (int i = 0; i < 3; i++) assert_int_equal(send_step(&f, "only B now", NULL), 1);

    /* 2. A restarts on the same port: the sender's reconnects find it, it gets steps again. */
    uint16_t port = f.r[0].port;
    assert_int_equal(start_replica(&f, 0, port, NULL), 0);
    assert_int_equal(wait_member(&f, "m|1|0|0", CX_PEER_UP, 5000), 0);
    seen[0] = seen[1] = 0;
    for (int i = 0; i < 4; i++) seen[send_step(&f, "after rejoin", NULL)]++;
    assert_true(seen[0] > 0);

    /* 3. A moves: it dies and comes back on a new port, and dials the sender itself. */
    cxt_peer_crash(&f.r[0]);
    assert_int_equal(wait_member(&f, "m|1|0|0", CX_PEER_FAILED, 3000), 0);
    assert_int_equal(start_replica(&f, 0, 0, cx_engine_local_url(f.e)), 0);
    assert_true(f.r[0].port != port);
    assert_int_equal(wait_member(&f, "m|1|0|0", CX_PEER_UP, 5000), 0);
    seen[0] = seen[1] = 0;
    for (int i = 0; i < 4; i++) seen[send_step(&f, "after the move", NULL)]++;
    assert_true(seen[0] > 0);

    /* 4. Scale down: B closes cleanly (LEFT), no step goes to it; then A; then CX_EPEER. */
    char reply[256];
    assert_int_equal(cxt_peer_cmd(&f.r[1], 5000, reply, sizeof reply, "QUIT"), 0);
    assert_int_equal(cxt_peer_reap(&f.r[1], 5000), 0);
    assert_int_equal(wait_member(&f, "m|1|0|1", CX_PEER_LEFT, 3000), 0);
    for (int i = 0; i < 3; i++) assert_int_equal(send_step(&f, "only A left", NULL), 0);
    assert_int_equal(cxt_peer_cmd(&f.r[0], 5000, reply, sizeof reply, "QUIT"), 0);
    assert_int_equal(cxt_peer_reap(&f.r[0], 5000), 0);
    assert_int_equal(wait_member(&f, "m|1|0|0", CX_PEER_LEFT, 3000), 0);
    assert_int_equal(cx_group_pick(f.g, &next), CX_EPEER);
    t0 = cxt_now_ns();
    assert_int_equal(cx_group_send(f.g, "nobody", 6, &op), CX_OK);
    assert_int_equal(cx_group_wait(op, 10000, NULL, NULL), CX_EPEER);
    double ms = cxt_ms_since(t0);
    fprintf(stderr, "no member left: CX_EPEER after %.0f ms (connect timeout %d ms)\n", ms, CONNECT_MS);
    assert_true(ms < CONNECT_MS + 2000);
    fx_down(&f);
}

/* mark_failed with a step in flight at a hung member: handed over at once, no kill needed. */
static void test_mark_failed(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f, 200, 1000);
    cx_lid_t next;
    assert_int_equal(cx_group_pick(f.g, &next), CX_OK);
    int a = (int)next.replica, b = 1 - a;
    stop_peer(&f.r[a]);
    cx_op_t *op;
    assert_int_equal(cx_group_send(f.g, "marked", 6, &op), CX_OK);
    cx_lid_t by;
    uint64_t id;
    assert_int_equal(cx_group_wait(op, 100, &by, &id), CX_EINPROGRESS);
    assert_int_equal(cx_group_mark_failed(f.g, f.r[a].lid), CX_OK);
    assert_int_equal(cx_group_wait(op, 5000, &by, &id), CX_OK);
    assert_int_equal((int)by.replica, b);
    assert_int_equal(next_step(&f.r[b], 5000, NULL), id);
    assert_int_equal(member_state(&f, f.r[a].lid), CX_PEER_FAILED);
    /* While marked, every step goes to the other member, in the order they were issued. */
    for (int i = 0; i < 3; i++) assert_int_equal(send_step(&f, "not to the marked one", NULL), b);
    enum { N = 64 };
    cx_op_t *ops[N];
    uint64_t ids[N];
    for (int i = 0; i < N; i++) assert_int_equal(cx_group_send(f.g, "burst", 5, &ops[i]), CX_OK);
    for (int i = 0; i < N; i++) {
        assert_int_equal(cx_group_wait(ops[i], 10000, &by, &ids[i]), CX_OK);
        assert_int_equal((int)by.replica, b);
        if (i) assert_true(ids[i] > ids[i - 1]);
    }
    for (int i = 0; i < N; i++) assert_int_equal(next_step(&f.r[b], 5000, NULL), ids[i]);
    cx_stats_t st;
    assert_int_equal(cx_stats(f.e, &st), CX_OK);
    assert_int_equal(st.steps_handed_over, 1);
    kill(f.r[a].pid, SIGCONT);
    fx_down(&f);
}

/* Least in-flight picks the member with fewer steps outstanding. */
static void test_least_inflight(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f, 1000, 10000); /* A stays stopped a while: it must not be declared failed */
    cx_group_close(f.g);
    assert_int_equal(cx_group_open(f.e, PATTERN, CX_PICK_LEAST_INFLIGHT, &f.g), CX_OK);
    if (g_static) {
        assert_int_equal(cx_group_add(f.g, f.r[0].url), CX_OK);
        assert_int_equal(cx_group_add(f.g, f.r[1].url), CX_OK);
    }
    assert_int_equal(wait_member(&f, "m|1|0|0", CX_PEER_UP, 5000), 0);
    assert_int_equal(wait_member(&f, "m|1|0|1", CX_PEER_UP, 5000), 0);
    /* A hung member keeps its step in flight: the next ones go to the other. */
    stop_peer(&f.r[0]);
    cx_op_t *held = NULL;
    cx_lid_t by;
    uint64_t id;
    for (int tries = 0; tries < 4 && !held; tries++) {
        cx_lid_t next;
        assert_int_equal(cx_group_pick(f.g, &next), CX_OK);
        if (next.replica == 1) {
            assert_int_equal(send_step(&f, "x", NULL), 1);
            continue;
        }
        assert_int_equal(cx_group_send(f.g, "x", 1, &held), CX_OK);
        assert_int_equal(cx_group_wait(held, 300, &by, &id), CX_EINPROGRESS);
    }
    assert_non_null(held);
    /* One step outstanding at A, none at B: each next step goes to B. */
    for (int i = 0; i < 5; i++) assert_int_equal(send_step(&f, "to the idle one", NULL), 1);
    kill(f.r[0].pid, SIGCONT);
    assert_int_equal(cx_group_wait(held, 10000, &by, &id), CX_OK);
    assert_int_equal(by.replica, 0);
    assert_int_equal(next_step(&f.r[0], 5000, NULL), id);
    fx_down(&f);
}

/* put_signal to a group: the data lands in the member's first region before the message. */
static void test_put_signal(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f, 200, 1000);
    size_t len = 64 << 10;
    uint8_t *buf = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(buf != MAP_FAILED);
    cxt_fill(buf, 1 << 20, 77, 0);
    assert_int_equal(cx_register_memory(f.e, buf, 1 << 20), CX_OK);
    for (int i = 0; i < 4; i++) {
        uint64_t off = (uint64_t)i * len;
        cx_lid_t lid;
        assert_int_equal(cx_group_pick(f.g, &lid), CX_OK);
        cxt_peer_t *to = &f.r[lid.replica];
        char msg[128];
        snprintf(msg, sizeof msg, "CHK %" PRIx64 " %zu %" PRIx64, to->base + off, len, cxt_hash(buf + off, len));
        cx_op_t *op;
        assert_int_equal(cx_group_put_signal(f.g, buf + off, len, off, msg, strlen(msg), &op), CX_OK);
        cx_lid_t by;
        uint64_t id;
        assert_int_equal(cx_group_wait(op, 10000, &by, &id), CX_OK);
        assert_int_equal(by.replica, lid.replica);
        char line[1024];
        assert_int_equal(cxt_peer_expect(to, "MSG ", 5000, line, sizeof line), 0);
        assert_non_null(strstr(line, " CHK OK STEP "));
    }
    /* Out of every member's first region: CX_EINVAL, not a hang. */
    cx_op_t *op;
    assert_int_equal(cx_group_put_signal(f.g, buf, len, (1 << 20) - 100, "m", 1, &op), CX_OK);
    assert_int_equal(cx_group_wait(op, 5000, NULL, NULL), CX_EINVAL);
    /* Local memory not registered: refused before anything is sent. */
    uint8_t local[16];
    assert_int_equal(cx_group_put_signal(f.g, local, sizeof local, 0, "m", 1, &op), CX_EINVAL);
    assert_int_equal(cx_unregister_memory(f.e, buf), CX_OK);
    munmap(buf, 1 << 20);
    fx_down(&f);
}

/* The same step delivered twice to one receiver (as after a reconnect): queued once. The test
 * writes the envelope itself (mobility/step.h's layout) and sends it as a plain message. */
static void put64(uint8_t *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
}

static void test_duplicate_dropped(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f, 200, 1000);
    cx_event_t ev;
    cxt_peer_t *r = &f.r[0];
    /* The receiver's incarnation: from its HELLO, as the sender's events report it. */
    uint64_t inc = 0;
    for (int i = 0; i < 50 && !inc; i++) {
        if (cx_wait_event(f.e, &ev, 100) != CX_OK) continue;
        char l[96];
        cx_lid_format(&ev.peer, l, sizeof l);
        if (!strcmp(l, r->lid) && ev.type == CX_EVENT_UP) inc = ev.incarnation;
    }
    assert_true(inc != 0);
    uint8_t m[24 + 5];
    put64(m, 0x0a31504554535843ull);
    put64(m + 8, inc);
    put64(m + 16, 1u << 20); /* far above the ids the group uses */
    memcpy(m + 24, "dupe!", 5);
    assert_int_equal(cx_send_msg(f.e, r->url, m, sizeof m), CX_OK);
    assert_int_equal(cx_send_msg(f.e, r->url, m, sizeof m), CX_OK); /* answered ok, not queued */
    assert_int_equal(next_step(r, 5000, NULL), 1u << 20);
    /* A message that starts with the magic but names another incarnation is a plain message. */
    put64(m + 8, inc ^ 1);
    assert_int_equal(cx_send_msg(f.e, r->url, m, sizeof m), CX_OK);
    char line[1024], want[256];
    assert_int_equal(cxt_peer_expect(r, "MSG ", 5000, line, sizeof line), 0);
    snprintf(want, sizeof want, "MSG m|0|0|0 %zu %" PRIx64, sizeof m, cxt_hash(m, sizeof m));
    assert_string_equal(line, want);
    char reply[512];
    assert_int_equal(cxt_peer_cmd(r, 5000, reply, sizeof reply, "STATS"), 0);
    assert_non_null(strstr(reply, "dup_steps=1"));
    /* Every message says its sender's incarnation; a plain one has step 0. */
    assert_int_equal(cxt_peer_cmd(r, 5000, reply, sizeof reply, "SEND %s 16 3", cx_engine_local_url(f.e)), 0);
    cx_msg_t msg;
    assert_int_equal(cx_recv_msg(f.e, &msg, 5000), CX_OK);
    assert_int_equal(msg.from_incarnation, inc);
    assert_int_equal(msg.step, 0);
    assert_int_equal(msg.len, 16);
    cx_msg_release(&msg);
    fx_down(&f);
}

/* A step re-sent to a receiver that already queued it: the group's own re-send. A is hung with
 * the step in flight, marked failed (no other member: the step waits), resumed (the first send
 * lands and is queued), then added again: the same step goes to A again and A drops it. */
static void test_resend_same_receiver(void **state)
{
    (void)state;
    fx_t f;
    fx_up(&f, 200, 5000);
    char reply[512];
    assert_int_equal(cxt_peer_cmd(&f.r[1], 5000, reply, sizeof reply, "QUIT"), 0); /* A alone */
    assert_int_equal(cxt_peer_reap(&f.r[1], 5000), 0);
    assert_int_equal(wait_member(&f, "m|1|0|1", CX_PEER_LEFT, 3000), 0);
    stop_peer(&f.r[0]);
    cx_op_t *op;
    assert_int_equal(cx_group_send(f.g, "twice", 5, &op), CX_OK);
    cx_lid_t by;
    uint64_t id = 0;
    assert_int_equal(cx_group_wait(op, 100, &by, &id), CX_EINPROGRESS);
    assert_int_equal(cx_group_mark_failed(f.g, f.r[0].lid), CX_OK);
    kill(f.r[0].pid, SIGCONT);
    uint64_t first = next_step(&f.r[0], 5000, NULL); /* the first send, queued */
    assert_true(first > 0);
    assert_int_equal(cx_group_wait(op, 100, &by, &id), CX_EINPROGRESS); /* the step waits for a member */
    assert_int_equal(cx_group_add(f.g, f.r[0].url), CX_OK);             /* A is back: sent again */
    assert_int_equal(cx_group_wait(op, 5000, &by, &id), CX_OK);
    assert_int_equal(by.replica, 0);
    assert_int_equal(id, first);
    assert_int_equal(cxt_peer_cmd(&f.r[0], 5000, reply, sizeof reply, "STATS"), 0);
    assert_non_null(strstr(reply, "dup_steps=1"));
    char line[1024];
    assert_int_equal(cxt_peer_expect(&f.r[0], "MSG ", 300, line, sizeof line), CX_ETIMEDOUT); /* once */
    cx_stats_t st;
    assert_int_equal(cx_stats(f.e, &st), CX_OK);
    assert_int_equal(st.steps_handed_over, 1);
    fx_down(&f);
}

/* Bad input: clear codes, no crash. */
static void test_bad_input(void **state)
{
    (void)state;
    cx_engine_t *e;
    assert_int_equal(cxt_engine(&e, "m", 0, 0, 0, 0), CX_OK);
    cx_group_t *g;
    assert_int_equal(cx_group_open(e, "m|1|*", CX_PICK_ROUND_ROBIN, &g), CX_EINVAL);
    assert_int_equal(cx_group_open(e, PATTERN, (cx_pick_t)7, &g), CX_EINVAL);
    assert_int_equal(cx_group_open(NULL, PATTERN, CX_PICK_ROUND_ROBIN, &g), CX_EINVAL);
    /* With etcd, the replicas of the cases before leave the directory when their 1 s leases end
     * (a group keeps every member it ever saw, so open it on an empty stage). */
    for (int i = 0; i < 60 && !g_static && cx_directory_list(e, PATTERN, NULL, 0) > 0; i++) usleep(100000);
    assert_int_equal(cx_group_open(e, PATTERN, CX_PICK_ROUND_ROBIN, &g), CX_OK);
    assert_int_equal(cx_group_add(g, "127.0.0.1:1#m|2|0|0"), CX_EINVAL); /* another stage */
    assert_int_equal(cx_group_add(g, "not a url"), CX_EINVAL);
    assert_int_equal(cx_group_mark_failed(g, "m|1|0|9"), CX_EINVAL); /* not a member */
    assert_int_equal(cx_group_members(g, NULL, NULL, 0), 0);
    cx_lid_t l;
    assert_int_equal(cx_group_pick(g, &l), CX_EPEER);
    cx_op_t *op;
    assert_int_equal(cx_group_send(g, NULL, 5, &op), CX_EINVAL);
    assert_int_equal(cx_group_send(g, "x", 1, NULL), CX_EINVAL);
    assert_int_equal(cx_group_send(g, "x", CX_MSG_MAX, &op), CX_EINVAL);
    /* A step sent to an empty group ends with CX_EPEER after the connect timeout (5 s). */
    assert_int_equal(cx_group_send(g, "x", 1, &op), CX_OK);
    /* Closing with the step still waiting: CX_ECLOSED. */
    cx_group_close(g);
    assert_int_equal(cx_group_wait(op, 5000, NULL, NULL), CX_ECLOSED);
    /* Steps of an open group when the engine goes: CX_ECLOSED too. */
    assert_int_equal(cx_group_open(e, PATTERN, CX_PICK_ROUND_ROBIN, &g), CX_OK);
    assert_int_equal(cx_group_send(g, "x", 1, &op), CX_OK);
    cx_engine_destroy(e);
    assert_int_equal(cx_group_wait(op, 5000, NULL, NULL), CX_ECLOSED);
}

int main(void)
{
    const char *d = getenv("CXT_DIRECTORY");
    /* "etcd": a real etcd on loopback, started here for this run (1 s leases). */
    static cxt_etcd_t etcd = { .pid = -1 };
    if (d && !strcmp(d, "etcd")) {
        int rc = cxt_etcd_start(&etcd, 20000);
        if (rc == 1) {
            if (cxt_required("etcd")) {
                fprintf(stderr, "cxt: required capability etcd missing: no %s (CONNEX_TEST_REQUIRE)\n", CXT_ETCD_BIN);
                return 1;
            }
            fprintf(stderr, "cxt: SKIPPED: needs etcd: no %s: the etcd variant is skipped\n", CXT_ETCD_BIN);
            return CXT_SKIP_EXIT;
        }
        if (rc) return 1;
        setenv("CONNEX_LEASE_MS", "1000", 1);
        d = etcd.endpoint;
    }
    if (d && *d && strcmp(d, "static")) {
        g_static = 0;
        setenv("CONNEX_DIRECTORY", d, 1);
        fprintf(stderr, "group_scenario: directory %s (members from the directory only)\n", d);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_scenario, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_mark_failed, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_least_inflight, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_put_signal, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_duplicate_dropped, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_resend_same_receiver, cxt_watchdog_setup, cxt_watchdog_teardown),
        cmocka_unit_test_setup_teardown(test_bad_input, cxt_watchdog_setup, cxt_watchdog_teardown),
    };
    int failed = cxt_run_tests(tests, NULL, NULL);
    cxt_etcd_stop(&etcd);
    return failed;
}
