/* pipeline: two pipeline stages on loopback moving a tensor from one to the next. Stage 0 (this
 * process) computes an activation tensor per step and writes it straight into stage 1's
 * registered memory with cx_put_signal: the write, then a message that stage 1 receives only once
 * the bytes are in place. Stage 1 (this program again, --stage1) applies its layer to the tensor
 * it finds there and answers with a checksum of the result, which stage 0 checks against its own
 * computation. Two slots alternate, so stage 0 writes step k+1 while stage 1 works on step k.
 *
 *   connex-pipeline-example [steps]     run it (default 8 steps; exit 0 when every step checked) */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dprintf */
#endif
#include "connex/connex.h"

#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define ROWS 256 /* tokens */
#define COLS 512 /* hidden size: a 256 x 512 f32 tensor, 512 KiB */
#define ELEMS (ROWS * COLS)
#define BYTES (ELEMS * sizeof(float))
#define SLOTS 2

/* Stage 0's layer output for step k, and stage 1's layer: both sides compute the same numbers in
 * the same order, so the checksum matches bit for bit. */
static void activations(float *x, unsigned k)
{
    for (unsigned i = 0; i < ELEMS; i++) x[i] = sinf((float)(k * 131u + i) * 0.001f);
}

static double layer_checksum(const float *x)
{
    double s = 0;
    for (unsigned i = 0; i < ELEMS; i++) {
        float y = x[i] > 0 ? 2.0f * x[i] : 0.0f; /* ReLU, then a scale */
        s += (double)y * (double)((i % COLS) + 1);
    }
    return s;
}

/* ---------------------------------------------------------------- stage 1 */

static int stage1_main(const char *stage0_url)
{
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = "pipe";
    c.stage = 1;
    cx_engine_t *e;
    if (cx_engine_create(&c, &e)) return 1;
    float *in = aligned_alloc(4096, SLOTS * BYTES);
    if (!in || cx_register_memory(e, in, SLOTS * BYTES)) return 1;
    /* Tell stage 0 where the slots are (it could also learn it from cx_group_put_signal's offsets). */
    char hello[64];
    int n = snprintf(hello, sizeof hello, "SLOTS %" PRIxPTR " %zu", (uintptr_t)in, (size_t)BYTES);
    if (cx_send_msg(e, stage0_url, hello, (size_t)n)) return 1;
    for (;;) {
        cx_msg_t m;
        int rc = cx_recv_msg(e, &m, 10000);
        if (rc) {
            fprintf(stderr, "stage 1: no step for 10 s: %s\n", cx_strerror(rc));
            break;
        }
        unsigned k, slot;
        char text[64];
        snprintf(text, sizeof text, "%.*s", (int)(m.len < 63 ? m.len : 63), (char *)m.data);
        cx_msg_release(&m);
        if (!strcmp(text, "END")) break;
        if (sscanf(text, "STEP %u SLOT %u", &k, &slot) != 2 || slot >= SLOTS) continue;
        double sum = layer_checksum(in + (size_t)slot * ELEMS); /* the tensor is in place */
        char done[96];
        n = snprintf(done, sizeof done, "DONE %u %.17g", k, sum);
        cx_send_msg(e, "pipe|0|0|0", done, (size_t)n);
    }
    cx_engine_destroy(e);
    free(in);
    return 0;
}

/* ---------------------------------------------------------------- stage 0 */

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--stage1")) return stage1_main(argv[2]);
    unsigned steps = argc == 2 ? (unsigned)strtoul(argv[1], NULL, 10) : 8;
    if (argc > 2 || !steps || steps > 10000) {
        fprintf(stderr, "usage: %s [steps]   (1..10000, default 8)\n", argv[0]);
        return 2;
    }
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = "pipe";
    c.stage = 0;
    cx_engine_t *e;
    int rc = cx_engine_create(&c, &e);
    if (rc) {
        fprintf(stderr, "engine: %s\n", cx_strerror(rc));
        return 1;
    }
    float *out = aligned_alloc(4096, SLOTS * BYTES);
    if (!out || cx_register_memory(e, out, SLOTS * BYTES)) return 1;
    printf("stage 0 %s (backends %s)\n", cx_engine_local_url(e), cx_engine_backends(e));

    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) {
        execl("/proc/self/exe", "connex-pipeline-example", "--stage1", cx_engine_local_url(e), (char *)NULL);
        _exit(127);
    }
    cx_msg_t m;
    uint64_t remote = 0;
    size_t rbytes = 0;
    if (cx_recv_msg(e, &m, 15000) == CX_OK) {
        char text[96];
        snprintf(text, sizeof text, "%.*s", (int)(m.len < 95 ? m.len : 95), (char *)m.data);
        if (sscanf(text, "SLOTS %" SCNx64 " %zu", &remote, &rbytes) != 2 || rbytes != BYTES) remote = 0;
        printf("stage 1 %s is up over %s: %d slots of %zu KiB at 0x%" PRIx64 "\n", m.from_url,
               cx_peer_backend(e, "pipe|1|0|0"), SLOTS, (size_t)BYTES >> 10, remote);
        cx_msg_release(&m);
    }
    unsigned ok = 0;
    if (remote) {
        cx_op_t *op[SLOTS] = { NULL };
        double want[SLOTS] = { 0 };
        for (unsigned k = 0; k <= steps; k++) {
            if (k < steps) {
                /* step k into slot k % 2, free since step k - 2's answer came: stage 1 may still be
                 * working on step k - 1 in the other slot */
                unsigned slot = k % SLOTS;
                float *x = out + (size_t)slot * ELEMS;
                activations(x, k);
                want[slot] = layer_checksum(x);
                char note[48];
                int n = snprintf(note, sizeof note, "STEP %u SLOT %u", k, slot);
                rc = cx_put_signal(e, "pipe|1|0|0", x, remote + (uint64_t)slot * BYTES, BYTES, note, (size_t)n,
                                   &op[slot]);
                if (rc) {
                    printf("step %u: put_signal: %s\n", k, cx_strerror(rc));
                    break;
                }
            }
            if (k == 0) continue;
            /* step k - 1: its put_signal, then stage 1's answer */
            unsigned prev = (k - 1) % SLOTS;
            rc = cx_op_wait(op[prev], -1);
            op[prev] = NULL;
            if (rc) {
                printf("step %u: put_signal: %s\n", k - 1, cx_strerror(rc));
                break;
            }
            if (cx_recv_msg(e, &m, 10000)) {
                printf("step %u: no answer from stage 1\n", k - 1);
                break;
            }
            unsigned kk = 0;
            double got = 0;
            char text[96];
            snprintf(text, sizeof text, "%.*s", (int)(m.len < 95 ? m.len : 95), (char *)m.data);
            cx_msg_release(&m);
            int good = sscanf(text, "DONE %u %lf", &kk, &got) == 2 && kk == k - 1 && got == want[prev];
            ok += good;
            printf("step %u: %dx%d f32 tensor (%zu KiB) -> stage 1 slot %u: checksum %.6f %s\n", k - 1, ROWS, COLS,
                   (size_t)BYTES >> 10, prev, got, good ? "ok" : "MISMATCH");
        }
        for (unsigned s = 0; s < SLOTS; s++)
            if (op[s]) cx_op_wait(op[s], -1);
        cx_send_msg(e, "pipe|1|0|0", "END", 3);
    } else {
        printf("stage 1 did not say where its slots are\n");
    }
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) st = -1;
    cx_stats_t s;
    cx_stats(e, &s);
    printf("pipeline: %u steps, %u verified, %" PRIu64 " bytes written with put_signal; stage 1 %s\n", steps, ok,
           s.bytes[CX_OPK_PUT_SIGNAL], WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "exited cleanly" : "FAILED");
    cx_engine_destroy(e);
    free(out);
    return ok == steps && WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}
