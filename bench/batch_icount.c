/* batch_icount: a fixed amount of work for an instruction counter (valgrind --tool=callgrind),
 * so that the engine's cost per batch entry can be set against a single op's.
 *
 *   batch_icount batch|single N K [size] [read|write]
 *
 * forks a target process, then from this one moves K calls of N blocks of `size` bytes (default
 * 4096) read from the target's region (or written to it): `batch` as one cx_batch_read (or
 * cx_batch_write) of N entries per call, `single` as N cx_read (cx_write) calls. One call of the same shape goes first (connect, region look-up).
 * The backend is the engine's choice, or CONNEX_BACKEND (and UCX_TLS / CONNEX_FI_PROVIDER for a
 * variant). Counting only this process and subtracting a run with another N leaves the cost of
 * N entries alone; bench/README.md shows the runs. Exit status 0 when every op succeeded. */
#include "connex/connex.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int target(int out, int in, size_t bytes)
{
    cx_config_t cfg = { .model = "icount-target" };
    cx_engine_t *e;
    void *buf = calloc(1, bytes);
    if (!buf || cx_engine_create(&cfg, &e)) return 1;
    if (cx_register_memory(e, buf, bytes)) return 1;
    const char *url = cx_engine_local_url(e);
    if (write(out, url, strlen(url) + 1) < 0) return 1;
    char c;
    while (read(in, &c, 1) < 0) {} /* until the initiator is done (or gone) */
    cx_engine_destroy(e);
    free(buf);
    return 0;
}

static int one_call(cx_engine_t *e, int batch, int wr, cx_batch_entry_t *ents, size_t n, int *st)
{
    if (batch) return wr ? cx_batch_write(e, ents, n, st) : cx_batch_read(e, ents, n, st);
    for (size_t i = 0; i < n; i++) {
        int rc = wr ? cx_write(e, ents[i].peer, ents[i].local, ents[i].remote, ents[i].len)
                    : cx_read(e, ents[i].peer, ents[i].local, ents[i].remote, ents[i].len);
        if (rc) return rc;
    }
    return CX_OK;
}

int main(int argc, char **argv)
{
    if (argc < 4 || (strcmp(argv[1], "batch") && strcmp(argv[1], "single"))) {
        fprintf(stderr, "usage: batch_icount batch|single N K [size] [read|write]\n");
        return 2;
    }
    int batch = !strcmp(argv[1], "batch");
    size_t n = strtoul(argv[2], NULL, 0), k = strtoul(argv[3], NULL, 0);
    size_t size = argc > 4 ? strtoul(argv[4], NULL, 0) : 4096;
    int wr = argc > 5 && !strcmp(argv[5], "write");
    if (argc > 5 && !wr && strcmp(argv[5], "read")) {
        fprintf(stderr, "batch_icount: the op is read or write\n");
        return 2;
    }
    if (!n || n > 65536 || !size || size > (64u << 20) / n) {
        fprintf(stderr, "batch_icount: N in 1..65536, N x size at most 64 MiB\n");
        return 2;
    }
    int up[2], down[2];
    if (pipe(up) || pipe(down)) return 1;
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        close(up[0]);
        close(down[1]);
        _exit(target(up[1], down[0], n * size));
    }
    close(up[1]);
    close(down[0]);
    char url[CX_URL_MAX];
    size_t got = 0;
    for (ssize_t r; got < sizeof url && (r = read(up[0], url + got, sizeof url - got)) > 0;) {
        got += (size_t)r;
        if (memchr(url, 0, got)) break;
    }
    int rc = 1;
    cx_config_t cfg = { .model = "icount-initiator" };
    cx_engine_t *e = NULL;
    void *buf = calloc(1, n * size);
    cx_batch_entry_t *ents = calloc(n, sizeof *ents);
    int *st = calloc(n, sizeof *st);
    uint64_t raddr = 0, rlen = 0;
    if (got && memchr(url, 0, got) && buf && ents && st && !cx_engine_create(&cfg, &e) &&
        !cx_register_memory(e, buf, n * size) && !cx_connect(e, url, 10000) &&
        !cx_peer_first_region(e, url, &raddr, &rlen) && rlen >= n * size) {
        for (size_t i = 0; i < n; i++)
            ents[i] = (cx_batch_entry_t){
                .peer = url, .local = (char *)buf + i * size, .remote = raddr + i * size, .len = size
            };
        rc = one_call(e, batch, wr, ents, n, st);
        for (size_t j = 0; j < k && rc == CX_OK; j++) rc = one_call(e, batch, wr, ents, n, st);
        if (rc) fprintf(stderr, "batch_icount: %s\n", cx_strerror(rc));
    } else {
        fprintf(stderr, "batch_icount: setup failed\n");
    }
    if (e) cx_engine_destroy(e);
    if (write(down[1], "x", 1) < 0) kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    free(buf);
    free(ents);
    free(st);
    return rc ? 1 : 0;
}
