/* The simulated copy engine: one worker thread per direction stands in for a CUDA stream, so
 * copies are asynchronous and complete in order per direction, like the real thing. */
#include "ce_impl.h"
#include "connex/options.h"
#include "connex/log.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

struct sim_q {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct ce_req *head, *tail;
    int stop, started;
};

struct sim_ce {
    struct sim_q q[2];
    double bytes_per_ns; /* 0: as fast as memcpy */
};

static void throttle(const struct sim_ce *s, size_t len, const struct timespec *t0)
{
    if (s->bytes_per_ns <= 0) return;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    double spent = (double)(now.tv_sec - t0->tv_sec) * 1e9 + (double)(now.tv_nsec - t0->tv_nsec);
    double left = (double)len / s->bytes_per_ns - spent;
    if (left <= 0) return;
    struct timespec d = { (time_t)(left / 1e9), (long)((long long)left % 1000000000LL) };
    while (nanosleep(&d, &d) != 0) {}
}

static void *worker(void *arg)
{
    struct ce_req *r;
    struct sim_q *q = arg;
    /* q is s->q[dir]: recover s to read the throttle. */
    struct sim_ce *s = NULL;
    pthread_mutex_lock(&q->mu);
    for (;;) {
        while (!q->head && !q->stop) pthread_cond_wait(&q->cv, &q->mu);
        if (!q->head) break; /* stop, and the queue is drained */
        r = q->head;
        q->head = r->next;
        if (!q->head) q->tail = NULL;
        pthread_mutex_unlock(&q->mu);
        if (!s) s = (struct sim_ce *)r->ce->impl;
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (r->dir == CX_CE_H2D)
            memcpy(r->dev, r->host, r->len);
        else
            memcpy(r->host, r->dev, r->len);
        throttle(s, r->len, &t0);
        cx_ce_complete(r, CX_OK);
        pthread_mutex_lock(&q->mu);
    }
    pthread_mutex_unlock(&q->mu);
    return NULL;
}

static void sim_stop(cx_ce_t *ce)
{
    struct sim_ce *s = ce->impl;
    if (!s) return;
    for (int d = 0; d < 2; d++) {
        struct sim_q *q = &s->q[d];
        if (!q->started) continue;
        pthread_mutex_lock(&q->mu);
        q->stop = 1;
        pthread_cond_signal(&q->cv);
        pthread_mutex_unlock(&q->mu);
        pthread_join(q->th, NULL);
    }
    for (int d = 0; d < 2; d++) {
        pthread_mutex_destroy(&s->q[d].mu);
        pthread_cond_destroy(&s->q[d].cv);
    }
    free(s);
    ce->impl = NULL;
}

static int sim_start(cx_ce_t *ce)
{
    struct sim_ce *s = calloc(1, sizeof *s);
    if (!s) return CX_ENOMEM;
    double v;
    (void)cx_opt_get_float("CONNEX_GPU_SIM_GBPS", &v); /* default 0: unlimited */
    s->bytes_per_ns = v;                               /* GB/s == bytes/ns */
    ce->impl = s;
    for (int d = 0; d < 2; d++) {
        pthread_mutex_init(&s->q[d].mu, NULL);
        pthread_cond_init(&s->q[d].cv, NULL);
    }
    for (int d = 0; d < 2; d++) {
        if (pthread_create(&s->q[d].th, NULL, worker, &s->q[d]) != 0) {
            cx_error("sim copy engine: cannot start a worker thread");
            sim_stop(ce);
            return CX_ERR;
        }
        s->q[d].started = 1;
    }
    return CX_OK;
}

static int sim_submit(cx_ce_t *ce, struct ce_req *r)
{
    struct sim_q *q = &((struct sim_ce *)ce->impl)->q[r->dir];
    pthread_mutex_lock(&q->mu);
    if (q->tail)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
    pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return CX_OK;
}

const struct ce_ops cx_ce_sim_ops = { sim_start, sim_submit, sim_stop };
