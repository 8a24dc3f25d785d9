/* connex-bench: every backend side by side against raw baselines (transfer), peer failure and
 * rejoin times (failover), and kill/rejoin cycles with resource accounting (soak).
 * Usage: see usage() below and bench/README.md. */
#include "bench.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: connex-bench transfer [--backend all|LIST] [--sizes 4K,64K,1M,16M] [--iters N]\n"
            "                             [--budget-ms MS] [--ops read,write,put_signal]\n"
            "                             [--baselines all|none|memcpy,tcp,zmq,ucx_raw,fi_raw,perftest]\n"
            "                             [--peer URL] [--json FILE] [--plot FILE.png] [--quiet]\n"
            "                             [--rounds N: all of it N times, then connex-c / raw loop per round]\n"
            "                             [--idle-peers N: name N peers that never come up beside the target]\n"
            "                             [--batch N: N blocks of each size per call, beside N async ops]\n"
            "                             [--mem KIND|LOCAL,REMOTE: host, sim or cuda memory on each side;\n"
            "                              beside it host-to-host and the device's copy rate, same run]\n"
            "       connex-bench failover [--backend ...] [--runs N] [--faults sigkill,sigstop,linkdown]\n"
            "                             [--hb-ms MS] [--hb-timeout-ms MS] [--json FILE]\n"
            "       connex-bench soak     [--backend ...] [--kills N, default 1000] [--kill-window-ms MS]\n"
            "                             [--seed N] [--json FILE]   (--cycles N: the same as --kills)\n"
            "       connex-bench classes  [--backend ...] [--bg-size 1G] [--crit-size 16K] [--chunk 1M]\n"
            "                             [--iters N, default 100000] [--budget-ms MS per phase, default 20000]\n"
            "       connex-bench serve    [--listen IP] [--port P] [--region SIZE] [--extra-regions N]\n"
            "                             [--mem host|sim|cuda: the region's memory]\n"
            "                             (the peer for --peer; N more 4 KiB regions registered after SIZE)\n"
            "backends: all, ucx, ucx_shm, ucx_tcp, libfabric, libfabric_shm, libfabric_tcp, zmq\n"
            "(failover and soak default to --backend all as well; each variant sets CONNEX_BACKEND and\n"
            " UCX_TLS / CONNEX_FI_PROVIDER for both processes)\n");
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "--child")) return cx_bench_child_main(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    /* The bench kills peers on purpose: their WARN lines would bury the progress line. */
    setenv("CONNEX_LOG", "error", 0);
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    static cx_bench_opts_t o;
    o.iters = 200;
    o.budget_ms = 250;
    o.backend = "all";
    o.ops = "read,write,put_signal";
    o.baselines = "all";
    o.runs = 5;
    o.rounds = 1;
    o.faults = 7;
    o.cycles = 1000;
    o.kill_window_ms = 50;
    o.hb_ms = 0; /* 0: engine defaults (1 s / 3 s) for transfer and soak */
    o.hb_timeout_ms = 0;
    ssize_t sl = readlink("/proc/self/exe", o.self, sizeof o.self - 1);
    if (sl <= 0) {
        perror("connex-bench: readlink /proc/self/exe");
        return 1;
    }
    o.self[sl] = 0;
    size_t used = 0;
    for (int i = 0; i < argc && used < sizeof o.cmdline - 1; i++) {
        int k = snprintf(o.cmdline + used, sizeof o.cmdline - used, "%s%s", i ? " " : "", i ? argv[i] : "connex-bench");
        if (k < 0) break;
        used += (size_t)k;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "transfer") && strcmp(cmd, "failover") && strcmp(cmd, "soak") && strcmp(cmd, "serve") &&
        strcmp(cmd, "classes")) {
        fprintf(stderr, "connex-bench: unknown command '%s'\n", cmd);
        usage(stderr);
        return 2;
    }
    const char *sizes = "4K,64K,1M,16M";
    if (!strcmp(cmd, "serve")) return cx_bench_serve_main(&o, argc - 2, argv + 2);
    static const struct option lo[] = { { "backend", 1, 0, 'b' },    { "sizes", 1, 0, 's' },
                                        { "iters", 1, 0, 'i' },      { "budget-ms", 1, 0, 'B' },
                                        { "ops", 1, 0, 'o' },        { "baselines", 1, 0, 'L' },
                                        { "peer", 1, 0, 'p' },       { "json", 1, 0, 'j' },
                                        { "plot", 1, 0, 'P' },       { "runs", 1, 0, 'r' },
                                        { "cycles", 1, 0, 'c' },     { "kills", 1, 0, 'c' },
                                        { "hb-ms", 1, 0, 'h' },      { "hb-timeout-ms", 1, 0, 'H' },
                                        { "quiet", 0, 0, 'q' },      { "bg-size", 1, 0, 'G' },
                                        { "crit-size", 1, 0, 'C' },  { "chunk", 1, 0, 'K' },
                                        { "faults", 1, 0, 'F' },     { "rounds", 1, 0, 'R' },
                                        { "idle-peers", 1, 0, 'I' }, { "kill-window-ms", 1, 0, 'W' },
                                        { "seed", 1, 0, 'S' },       { "batch", 1, 0, 'N' },
                                        { "mem", 1, 0, 'M' },        { 0, 0, 0, 0 } };
    optind = 2;
    int c, budget_set = 0, iters_set = 0;
    o.cls_bg = (size_t)1 << 30;
    o.cls_crit = (size_t)16 << 10;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        long v = optarg ? strtol(optarg, NULL, 10) : 0;
        switch (c) {
        case 'b': o.backend = optarg; break;
        case 's': sizes = optarg; break;
        case 'i':
            o.iters = (int)v;
            iters_set = 1;
            break;
        case 'B':
            o.budget_ms = (int)v;
            budget_set = 1;
            break;
        case 'o': o.ops = optarg; break;
        case 'L': o.baselines = optarg; break;
        case 'p': o.peer = optarg; break;
        case 'j': o.json = optarg; break;
        case 'P': o.plot = optarg; break;
        case 'r': o.runs = (int)v; break;
        case 'R': o.rounds = (int)v; break;
        case 'I': o.idle_peers = (int)v; break;
        case 'N': o.batch = (int)v; break;
        case 'M': {
            char tmp[32];
            snprintf(tmp, sizeof tmp, "%s", optarg);
            char *comma = strchr(tmp, ',');
            if (comma) *comma = 0;
            o.mem_local = cx_bench_parse_mem(tmp);
            o.mem_remote = comma ? cx_bench_parse_mem(comma + 1) : o.mem_local;
            if (o.mem_local < 0 || o.mem_remote < 0) {
                fprintf(stderr, "connex-bench: --mem KIND or LOCAL,REMOTE, each host, sim or cuda\n");
                return 2;
            }
            break;
        }
        case 'c': o.cycles = (int)v; break;
        case 'W': o.kill_window_ms = (int)v; break;
        case 'S': o.seed = strtoull(optarg, NULL, 10); break;
        case 'h': o.hb_ms = (uint32_t)v; break;
        case 'H': o.hb_timeout_ms = (uint32_t)v; break;
        case 'q': o.quiet = 1; break;
        case 'F': {
            static const char *const names[] = { "sigkill", "sigstop", "linkdown" };
            char tmp[128];
            snprintf(tmp, sizeof tmp, "%s", optarg);
            o.faults = 0;
            for (char *sv = NULL, *t = strtok_r(tmp, ",", &sv); t; t = strtok_r(NULL, ",", &sv)) {
                int k = 0;
                while (k < 3 && strcmp(t, names[k])) k++;
                if (k == 3) {
                    fprintf(stderr, "connex-bench: unknown fault '%s' (sigkill, sigstop, linkdown)\n", t);
                    return 2;
                }
                o.faults |= 1u << k;
            }
            if (!o.faults) {
                fprintf(stderr, "connex-bench: --faults names none\n");
                return 2;
            }
            break;
        }
        case 'G':
        case 'C':
        case 'K': {
            size_t sz;
            if (cx_bench_parse_size(optarg, &sz) || !sz || sz % 8 || (c == 'K' && sz > 0xFFFFF000u)) {
                fprintf(stderr, "connex-bench: bad size '%s' (a multiple of 8 bytes)\n", optarg);
                return 2;
            }
            if (c == 'G')
                o.cls_bg = sz;
            else if (c == 'C')
                o.cls_crit = sz;
            else
                o.cls_chunk = (uint32_t)sz;
            break;
        }
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "connex-bench: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (o.iters < 1 || o.iters > 1000000 || o.budget_ms < 1 || o.runs < 1 || o.runs > 10000 || o.cycles < 1 ||
        o.kill_window_ms < 0 || o.kill_window_ms > 600000 || o.rounds < 1 || o.rounds > 50 || o.idle_peers < 0 ||
        o.idle_peers > 10000 || o.batch < 0 || o.batch > 65536 || o.cycles > 1000000 || (o.hb_ms && o.hb_ms < 10) ||
        (o.hb_timeout_ms && o.hb_timeout_ms < 2 * o.hb_ms)) {
        fprintf(stderr,
                "connex-bench: bad numbers: --iters 1..1e6, --budget-ms >= 1, --runs 1..10000, --rounds 1..50, "
                "--idle-peers 0..10000, --batch 0..65536, "
                "--kills (--cycles) >= 1, --kill-window-ms 0..600000, "
                "--hb-ms >= 10, --hb-timeout-ms >= 2 x --hb-ms\n");
        return 2;
    }
    if (cx_bench_parse_sizes(sizes, &o)) return 2;
    const cx_bench_variant_t *vs[16];
    if (cx_bench_variants(o.backend, vs, 16) < 0) return 2;
    if (!strcmp(cmd, "transfer")) return cx_bench_transfer(&o);
    if (!strcmp(cmd, "classes")) {
        if (!budget_set) o.budget_ms = 20000;
        if (!iters_set) o.iters = 100000; /* the budget ends a phase: reads for all of it */
        return cx_bench_classes(&o);
    }
    if (!strcmp(cmd, "failover")) {
        /* Short heartbeats keep SIGSTOP and link-down runs short; --hb-ms sets them. */
        if (!o.hb_ms) o.hb_ms = 200;
        if (!o.hb_timeout_ms) o.hb_timeout_ms = 5 * o.hb_ms;
        return cx_bench_failover(&o);
    }
    return cx_bench_soak(&o);
}
