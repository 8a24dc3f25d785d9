/* mobile_endpoints: a sender and two replicas of one stage, on loopback, through the seeds'
 * scenario (docs/mobility.md): a replica is killed with a step in flight and the step completes on
 * the other; it rejoins on the same port; it moves to a new port; the stage scales down to nothing.
 * Every step is printed: who sent it, who took it, and whether it was handed over.
 *
 *   connex-mobile-example            run the scenario (exit 0 when every step went as expected)
 *
 * The replicas are this same program, started with --replica (it execs itself): each dials the
 * sender, so the sender's group ("demo|1|*|*") learns them from the transport events, and prints
 * every step it receives. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dprintf */
#endif
#include "connex/connex.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
    nanosleep(&ts, NULL);
}

/* ---------------------------------------------------------------- replica */

static volatile sig_atomic_t g_quit;
static void on_term(int sig)
{
    (void)sig;
    g_quit = 1;
}

static int replica_main(int idx, unsigned port, const char *sender, int notify_fd)
{
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = "demo";
    c.stage = 1;
    c.replica = (uint32_t)idx;
    c.port = (uint16_t)port;
    c.heartbeat_ms = 200;
    c.heartbeat_timeout_ms = 1000;
    cx_engine_t *e;
    if (cx_engine_create(&c, &e)) return 1;
    signal(SIGTERM, on_term);
    /* Dial the sender: after a restart (same or new port) that is how it hears of us at once. */
    cx_connect(e, sender, 5000);
    dprintf(notify_fd, "%s\n", cx_engine_local_url(e));
    close(notify_fd);
    char me = (char)('A' + idx);
    while (!g_quit) {
        cx_msg_t m;
        if (cx_recv_msg(e, &m, 100) != CX_OK) continue;
        char from[96];
        cx_lid_format(&m.from, from, sizeof from);
        if (m.step)
            printf("    [replica %c] queued step %" PRIu64 " from %s (incarnation %016" PRIx64 "): \"%.*s\"\n", me,
                   m.step, from, m.from_incarnation, (int)m.len, (char *)m.data);
        else
            printf("    [replica %c] plain message from %s: %zu bytes\n", me, from, m.len);
        fflush(stdout);
        cx_msg_release(&m);
    }
    cx_engine_destroy(e); /* clean close: the sender sees LEFT */
    return 0;
}

/* ---------------------------------------------------------------- sender */

typedef struct replica {
    pid_t pid;
    char url[CX_URL_MAX];
    unsigned port;
} replica_t;

static int start_replica(replica_t *r, int idx, unsigned port, const char *sender)
{
    int fds[2];
    if (pipe(fds)) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        close(fds[0]);
        char a[16], p[16], n[16];
        snprintf(a, sizeof a, "%d", idx);
        snprintf(p, sizeof p, "%u", port);
        snprintf(n, sizeof n, "%d", fds[1]);
        execl("/proc/self/exe", "connex-mobile-example", "--replica", a, p, sender, n, (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    char buf[CX_URL_MAX + 2] = "";
    size_t got = 0;
    uint64_t t0 = now_ms();
    while (got < sizeof buf - 1 && !strchr(buf, '\n') && now_ms() - t0 < 15000) {
        ssize_t k = read(fds[0], buf + got, sizeof buf - 1 - got);
        if (k <= 0) break;
        got += (size_t)k;
        buf[got] = 0;
    }
    close(fds[0]);
    buf[strcspn(buf, "\n")] = 0;
    cx_url_t u;
    if (cx_url_parse(buf, &u, NULL, 0)) {
        fprintf(stderr, "replica %c did not start\n", 'A' + idx);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        return -1;
    }
    r->pid = pid;
    snprintf(r->url, sizeof r->url, "%s", buf);
    r->port = u.port;
    printf("  replica %c up at %s (pid %d)\n", 'A' + idx, r->url, (int)pid);
    return 0;
}

static void kill9(replica_t *r)
{
    kill(r->pid, SIGKILL);
    waitpid(r->pid, NULL, 0);
    r->pid = -1;
}

static void stop_clean(replica_t *r)
{
    kill(r->pid, SIGTERM);
    waitpid(r->pid, NULL, 0);
    r->pid = -1;
}

static void wait_stopped(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    for (int i = 0; i < 500; i++) {
        FILE *f = fopen(path, "r");
        char st = 0;
        if (f) {
            int c;
            while ((c = fgetc(f)) != EOF && c != ')') {}
            if (fscanf(f, " %c", &st) != 1) st = 0;
            fclose(f);
        }
        if (st == 'T' || st == 't') break;
        sleep_ms(2);
    }
    sleep_ms(20);
}

static cx_peer_state_t member_state(cx_group_t *g, int idx)
{
    cx_lid_t lids[8];
    cx_peer_state_t st[8];
    int n = cx_group_members(g, lids, st, 8);
    for (int i = 0; i < n && i < 8; i++)
        if (lids[i].replica == (uint32_t)idx) return st[i];
    return CX_PEER_UNKNOWN;
}

static int wait_member(cx_group_t *g, int idx, cx_peer_state_t want)
{
    for (uint64_t t0 = now_ms(); now_ms() - t0 < 8000; sleep_ms(10))
        if (member_state(g, idx) == want) return 0;
    printf("  !! replica %c never reached state %d\n", 'A' + idx, want);
    return -1;
}

static int g_failures;
static uint64_t g_handed;

/* Sends one step and waits; prints what happened. want: replica index expected, -1 any,
 * -2 an error expected. Returns the replica that took it (or -1). */
static int step(cx_engine_t *e, cx_group_t *g, const char *text, int want, int wait_ms)
{
    cx_op_t *op;
    uint64_t t0 = now_ms();
    int rc = cx_group_send(g, text, strlen(text), &op);
    cx_lid_t by;
    uint64_t id = 0;
    if (rc == CX_OK) rc = cx_group_wait(op, wait_ms, &by, &id);
    cx_stats_t st;
    cx_stats(e, &st);
    int handed = st.steps_handed_over > g_handed;
    g_handed = st.steps_handed_over;
    sleep_ms(30); /* let the replica's line come out first */
    if (rc != CX_OK) {
        printf("  sender: step \"%s\": %s after %" PRIu64 " ms\n", text, cx_strerror(rc), now_ms() - t0);
        if (want != -2) g_failures++;
        return -1;
    }
    printf("  sender: step %" PRIu64 " \"%s\" taken by replica %c%s (%" PRIu64 " ms)\n", id, text,
           'A' + (int)by.replica, handed ? ", HANDED OVER" : "", now_ms() - t0);
    if (want == -2 || (want >= 0 && (int)by.replica != want)) {
        printf("  !! expected %s\n", want == -2 ? "an error" : want ? "replica B" : "replica A");
        g_failures++;
    }
    return (int)by.replica;
}

static int sender_main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = "demo";
    c.heartbeat_ms = 200;
    c.heartbeat_timeout_ms = 1000;
    c.connect_timeout_ms = 2000;
    cx_engine_t *e;
    int rc = cx_engine_create(&c, &e);
    if (rc) {
        fprintf(stderr, "engine: %s\n", cx_strerror(rc));
        return 1;
    }
    const char *me = cx_engine_local_url(e);
    printf("sender %s (backends %s)\n", me, cx_engine_backends(e));
    cx_group_t *g;
    if (cx_group_open(e, "demo|1|*|*", CX_PICK_ROUND_ROBIN, &g)) return 1;
    replica_t r[2];
    if (start_replica(&r[0], 0, 0, me) || start_replica(&r[1], 1, 0, me)) return 1;
    if (wait_member(g, 0, CX_PEER_UP) || wait_member(g, 1, CX_PEER_UP)) return 1;

    printf("\n1. steps go round robin over both replicas\n");
    for (int i = 0; i < 4; i++) {
        char t[32];
        snprintf(t, sizeof t, "token batch %d", i);
        step(e, g, t, -1, 5000);
    }

    printf("\n2. replica A hangs with a step in flight, then is killed: the step completes on B\n");
    cx_lid_t next;
    if (cx_group_pick(g, &next) == CX_OK && next.replica == 1) step(e, g, "one for B first", 1, 5000);
    kill(r[0].pid, SIGSTOP);
    wait_stopped(r[0].pid);
    printf("  replica A stopped (SIGSTOP)\n");
    cx_op_t *op;
    const char *text = "in flight when A died";
    cx_group_send(g, text, strlen(text), &op);
    cx_lid_t by;
    uint64_t id;
    if (cx_group_wait(op, 200, &by, &id) != CX_EINPROGRESS) {
        printf("  !! the step did not wait for A\n");
        g_failures++;
    } else {
        printf("  sender: step in flight at replica A; kill -9 A\n");
        uint64_t t0 = now_ms();
        kill9(&r[0]);
        rc = cx_group_wait(op, 5000, &by, &id);
        cx_stats_t st;
        cx_stats(e, &st);
        g_handed = st.steps_handed_over;
        sleep_ms(30);
        printf("  sender: step %" PRIu64 " \"%s\": %s, taken by replica %c, handed over %" PRIu64
               " ms after the kill\n",
               id, text, cx_strerror(rc), 'A' + (int)by.replica, now_ms() - t0);
        if (rc || by.replica != 1 || st.steps_handed_over != 1) g_failures++;
    }
    for (int i = 0; i < 2; i++) step(e, g, "while A is down", 1, 5000);

    printf("\n3. replica A restarts on the same port and rejoins\n");
    unsigned port = r[0].port;
    if (start_replica(&r[0], 0, port, me) || wait_member(g, 0, CX_PEER_UP)) return 1;
    for (int i = 0; i < 4; i++) step(e, g, "after the rejoin", -1, 5000);

    printf("\n4. replica A moves: killed, restarted on a new port, it dials the sender\n");
    kill9(&r[0]);
    wait_member(g, 0, CX_PEER_FAILED);
    if (start_replica(&r[0], 0, 0, me) || wait_member(g, 0, CX_PEER_UP)) return 1;
    for (int i = 0; i < 4; i++) step(e, g, "after the move", -1, 5000);

    printf("\n5. scale down: B closes cleanly (LEFT), then A; then no member is left\n");
    stop_clean(&r[1]);
    wait_member(g, 1, CX_PEER_LEFT);
    for (int i = 0; i < 3; i++) step(e, g, "B has left", 0, 5000);
    stop_clean(&r[0]);
    wait_member(g, 0, CX_PEER_LEFT);
    step(e, g, "nobody to take it", -2, 10000);

    cx_stats_t st;
    cx_stats(e, &st);
    printf("\nsteps handed over: %" PRIu64 "; %s\n", st.steps_handed_over,
           g_failures ? "SOME STEPS DID NOT GO AS EXPECTED" : "every step went as expected");
    cx_group_close(g);
    cx_engine_destroy(e);
    return g_failures ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 6 && !strcmp(argv[1], "--replica"))
        return replica_main(atoi(argv[2]), (unsigned)strtoul(argv[3], NULL, 10), argv[4], atoi(argv[5]));
    if (argc != 1) {
        fprintf(stderr, "usage: %s   (runs the scenario; see docs/mobility.md)\n", argv[0]);
        return 2;
    }
    return sender_main();
}
