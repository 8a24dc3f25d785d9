/* connex-bench: shared declarations of the subcommands (transfer, failover, soak), the peer
 * process they spawn, the raw baselines and the report writers. Depends on the public API
 * (connex/connex.h) only: the bench measures what an application sees. */
#ifndef CX_BENCH_H
#define CX_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "connex/connex.h"

#define CX_BENCH_MODEL "bench"
#define CX_BENCH_MAX_SIZES 32
#define CX_BENCH_MAX_ENV 4

/* ---------------------------------------------------------------- options */

typedef struct cx_bench_opts {
    size_t sizes[CX_BENCH_MAX_SIZES];
    int nsizes;
    int iters;             /* timed iterations per point, at most */
    int budget_ms;         /* time per point, at most (at least 3 iterations are always done) */
    const char *backend;   /* "all" or a comma list of variants / backends */
    const char *ops;       /* comma list: read,write,put_signal */
    const char *baselines; /* "all", "none" or a comma list */
    const char *json;      /* --json FILE */
    const char *plot;      /* --plot FILE.png */
    const char *peer;      /* --peer URL: a remote `connex-bench serve` instead of a child */
    int rounds;            /* transfer: every variant and baseline this many times, alternating */
    int idle_peers;        /* transfer: peers named (never up) beside the target, as in a big cluster */
    int batch;             /* transfer: N blocks of each size per call (cx_batch_*), beside N async ops; 0: one op */
    int mem_local, mem_remote; /* transfer --mem: CX_MEM_* of this side's buffer and of the peer's region */
    int runs;                  /* failover */
    unsigned faults;           /* failover: bit per fault (sigkill 1, sigstop 2, linkdown 4) */
    int cycles;                /* soak: kills per variant */
    int kill_window_ms;        /* soak: the kill comes at a random moment this long after the rejoin */
    uint64_t seed;             /* soak: of the kill moments and op sizes (0: from the clock) */
    size_t cls_bg, cls_crit;   /* classes: background transfer and critical read sizes */
    uint32_t cls_chunk;        /* classes: background_chunk of the engine (0: its default) */
    uint32_t hb_ms, hb_timeout_ms;
    int quiet;
    char self[4096];    /* this executable, re-exec'd as the peer */
    char cmdline[1024]; /* for the reports */
} cx_bench_opts_t;

/* A backend variant: a backend name plus the environment that picks its transport. */
typedef struct cx_bench_variant {
    const char *name;                  /* "ucx_tcp" */
    const char *backend;               /* "ucx" (CONNEX_BACKEND) */
    const char *env[CX_BENCH_MAX_ENV]; /* "UCX_TLS=tcp,self", NULL-terminated */
    const char *raw;                   /* raw baseline of this transport: "ucx", "fi" or NULL */
    int shm;                           /* data through shared memory: no link to take down */
} cx_bench_variant_t;

/* Variants named by a comma list ("all", "zmq", "ucx" = every ucx variant, "ucx_shm"...).
 * Returns how many were written to out (at most max); unknown names are an error (-1). */
int cx_bench_variants(const char *list, const cx_bench_variant_t **out, int max);
void cx_bench_variant_env(const cx_bench_variant_t *v, int set); /* setenv / unsetenv */

/* ---------------------------------------------------------------- results */

typedef struct cx_bench_row {
    char backend[40]; /* variant or baseline name */
    char pair[16];    /* the backend the pair used (cx_peer_backend), "" for baselines */
    char op[16];      /* read, write, put_signal, copy */
    size_t size;
    int iters;
    double p50_us, p99_us, max_us, gbps; /* gbps: size / p50 */
    int baseline;                        /* 1: a raw-library or host baseline, not connex */
    char note[96];                       /* "ok (verified)", "skipped: ...", "FAIL: ..." */
    int round;                           /* transfer --rounds: which round measured it (0-based) */
    int batch;                           /* blocks per call (transfer --batch N); 0: one op per call */
    int async;                           /* 1: the call's blocks went as async ops, not one batch */
    int mem_local, mem_remote;           /* CX_MEM_* of the two sides (transfer --mem); host: 0 */
} cx_bench_row_t;

/* connex-c against the raw loop of its transport (ucx_raw, fi_raw) at one point, paired per round
 * (bench_ratio.c): medians over the rounds, the ratio's median and range, and best against best. */
typedef struct cx_bench_ratio {
    char backend[40], raw[40], op[16];
    size_t size;
    int batch, async;       /* the rows' shape (cx_bench_row_t) */
    int n;                  /* rounds with both */
    double cx_p50, raw_p50; /* medians of the rounds' p50s, us */
    double ratio, lo, hi;   /* connex p50 / raw p50 of the same round: median, min, max */
    double best;            /* lowest connex p50 / lowest raw p50 over the rounds */
} cx_bench_ratio_t;

typedef struct cx_bench_dist {
    int n;
    double p50, p99, max;
} cx_bench_dist_t;

typedef struct cx_bench_fo_row {
    char backend[40];
    char fault[16]; /* sigkill, sigstop, linkdown */
    int runs, ok;
    cx_bench_dist_t to_event;  /* fault -> FAILED (sigkill) or SUSPECT (sigstop, linkdown) */
    cx_bench_dist_t to_failed; /* fault -> FAILED */
    cx_bench_dist_t to_ops;    /* fault -> the in-flight op returned */
    cx_bench_dist_t to_rejoin; /* restarted process started -> first good transfer */
    cx_bench_dist_t up_rejoin; /* restarted engine up -> first good transfer */
    char note[128];
} cx_bench_fo_row_t;

/* soak: op kinds the survivor's threads run, and how each op ended. */
enum { CX_SOAK_READ, CX_SOAK_WRITE, CX_SOAK_PUTSIG, CX_SOAK_BATCH, CX_SOAK_KINDS };
/* EARLY: CX_EINVAL from a restarted peer for an op started before it had registered its region
 * (the remote range was not registered yet); the same status for an op started later is OTHER. */
enum { CX_SOAK_OK, CX_SOAK_EPEER, CX_SOAK_ETIMEDOUT, CX_SOAK_EARLY, CX_SOAK_OTHER, CX_SOAK_BADDATA, CX_SOAK_RESULTS };

typedef struct cx_bench_soak {
    char backend[40];
    int cycles, done; /* kills asked for, kills done */
    int threads;
    uint64_t seed; /* of the kill moments */
    /* start: before the first peer; warm: after the warm-up kills; end: after the last rejoin */
    long fds_start, fds_warm, fds_end, fds_max;
    long rss_start, rss_warm, rss_end, rss_max; /* KiB */
    long regions_start, regions_end, rbytes_start, rbytes_end;
    uint64_t ops[CX_SOAK_KINDS][CX_SOAK_RESULTS]; /* a batch counts each of its async ops */
    uint64_t other_codes[16];                     /* CX_SOAK_OTHER by -status (15: anything else) */
    cx_bench_dist_t to_failed;                    /* kill -> FAILED event */
    cx_bench_dist_t to_rejoin;                    /* new process started -> first good transfer */
    cx_bench_dist_t up_rejoin;                    /* its engine up -> first good transfer */
    double seconds;
    int crashed; /* the survivor died of a signal (its number), or -1:
                                                   it exited without a result */
    char verdict[160];
} cx_bench_soak_t;

void cx_bench_add_row(const cx_bench_row_t *r);
int cx_bench_nrows(void);
const cx_bench_row_t *cx_bench_rows(void);
void cx_bench_add_fo(const cx_bench_fo_row_t *r);
void cx_bench_add_soak(const cx_bench_soak_t *s);

/* Report writers: table on stdout, JSON file, gnuplot PNG. 0 or -1 (message on stderr). */
void cx_bench_print_transfer(void);
void cx_bench_set_round(int round);                  /* stamped on the rows added from now on */
int cx_bench_ratios(cx_bench_ratio_t *out, int max); /* bench_ratio.c: how many written */
void cx_bench_print_ratios(int rounds);
void cx_bench_copy_rates(const cx_bench_opts_t *o); /* transfer --mem: the device's copy rows */
void cx_bench_print_staged(void);                   /* transfer --mem: staged beside host-to-host and copy rate */
void cx_bench_print_failover(void);
void cx_bench_print_targets(uint32_t hb_ms, uint32_t hb_to_ms);
void cx_bench_print_soak(void);
void cx_bench_soak_json_line(void); /* one line on stdout: {"soak": [...]} */
int cx_bench_write_json(const cx_bench_opts_t *o, const char *path);
int cx_bench_plot(const char *png);

/* ---------------------------------------------------------------- utilities */

uint64_t cx_bench_now_ns(void);
int cx_bench_parse_size(const char *s, size_t *out); /* 4K, 16M, 1G, 4096 */
int cx_bench_parse_sizes(const char *s, cx_bench_opts_t *o);
const char *cx_bench_human(size_t n, char *buf, size_t len);
/* Sorts samples (ns) and returns p50/p99/max in microseconds. */
cx_bench_dist_t cx_bench_dist(uint64_t *ns, int n);
void cx_bench_row_fill(cx_bench_row_t *r, uint64_t *ns, int n);
void cx_bench_progress(const cx_bench_opts_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cx_bench_progress_done(const cx_bench_opts_t *o);
int cx_bench_list_has(const char *list, const char *name); /* "all" matches everything */
/* "host", "sim" or "cuda" -> CX_MEM_*; -1 for anything else. The simulated device is switched on
 * (CONNEX_GPU_SIM=1, inherited by the peer process) when "sim" is named. */
int cx_bench_parse_mem(const char *s);
const char *cx_bench_mem_name(int kind);

/* Fast pattern: word i of the region filled with seed. */
void cx_bench_fill(void *buf, size_t len, uint32_t seed);
/* The bytes that cx_bench_fill puts at byte offset off (a multiple of 8) of a region. */
void cx_bench_fill_at(void *buf, size_t len, uint32_t seed, size_t off);
int cx_bench_check(const void *buf, size_t len, uint32_t seed, size_t off); /* 1 ok */

long cx_bench_count_fds(void);
long cx_bench_rss_kib(void);

/* ---------------------------------------------------------------- the peer process */

typedef struct cx_bench_child_opts {
    uint16_t port;         /* 0: ephemeral */
    const char *listen_ip; /* NULL: 127.0.0.1 */
    size_t region;
    uint32_t seed;
    const char *connect; /* the survivor's URL, or NULL */
    uint32_t hb_ms, hb_timeout_ms;
    const char *netns; /* run it inside this network namespace (ip netns exec), or NULL */
    int mem;           /* CX_MEM_* of its region */
} cx_bench_child_opts_t;

typedef struct cx_bench_child {
    pid_t pid;
    int in, out;
    char url[CX_URL_MAX];
    char lid[CX_URL_MAX];
    uint64_t base;
    size_t len;
    uint16_t port;
    uint64_t t_spawn_ns;      /* fork */
    uint64_t t_engine_ns;     /* the child's engine was created (CLOCK_MONOTONIC is system-wide) */
    uint64_t t_registered_ns; /* its region was registered */
} cx_bench_child_t;

/* Starts this program as a peer and waits (bounded) for its READY line. 0 or -1. */
int cx_bench_spawn(const cx_bench_opts_t *o, cx_bench_child_t *c, const cx_bench_child_opts_t *co);
void cx_bench_stop(cx_bench_child_t *c);        /* stdin EOF: clean close, SIGKILL after 5 s */
void cx_bench_reap(cx_bench_child_t *c);        /* after a kill: wait, close pipes */
int cx_bench_child_main(int argc, char **argv); /* --child ... */
int cx_bench_serve_main(const cx_bench_opts_t *o, int argc, char **argv);

/* Bounded wait for an event of `type` (any peer); others are skipped. 0 or CX_ETIMEDOUT. */
int cx_bench_wait_event(cx_engine_t *e, cx_event_type_t type, int ms, cx_event_t *out);
int cx_bench_engine(cx_engine_t **e, const char *listen_ip, uint32_t hb_ms, uint32_t hb_to_ms, uint32_t op_to_ms);

/* ---------------------------------------------------------------- subcommands */

int cx_bench_transfer(const cx_bench_opts_t *o);
int cx_bench_failover(const cx_bench_opts_t *o);
int cx_bench_soak(const cx_bench_opts_t *o);
int cx_bench_classes(const cx_bench_opts_t *o); /* traffic classes: critical p99 under background */
/* Raw baselines in the same run: memcpy, TCP, ZeroMQ, and the raw library loops / ucx_perftest
 * for the variants that ran. */
void cx_bench_baselines(const cx_bench_opts_t *o, const cx_bench_variant_t *const *vs, int nv);
void cx_bench_rawnet(const cx_bench_opts_t *o); /* raw TCP and ZeroMQ loops */

#endif
