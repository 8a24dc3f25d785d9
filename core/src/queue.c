#include "queue.h"
#include "units.h"

#include "connex/log.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <time.h>

/* One attribute for every condition variable: each synchronous op makes one, and building the
 * attribute each time was a third of that. */
static pthread_condattr_t mono_attr;
static pthread_once_t mono_once = PTHREAD_ONCE_INIT;

static void mono_attr_init(void)
{
    pthread_condattr_init(&mono_attr);
    pthread_condattr_setclock(&mono_attr, CLOCK_MONOTONIC);
}

void cx_cond_init_mono(pthread_cond_t *cv)
{
    pthread_once(&mono_once, mono_attr_init);
    pthread_cond_init(cv, &mono_attr);
}

void cx_deadline_ms(struct timespec *ts, int timeout_ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += timeout_ms / CX_MS_PER_S;
    ts->tv_nsec += (long)((uint64_t)(timeout_ms % CX_MS_PER_S) * CX_NS_PER_MS);
    if (ts->tv_nsec >= (long)CX_NS_PER_S) {
        ts->tv_sec++;
        ts->tv_nsec -= (long)CX_NS_PER_S;
    }
}

/* deadline NULL: wait forever. Returns 0 or ETIMEDOUT. */
int cx_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, const struct timespec *deadline)
{
    if (!deadline) return pthread_cond_wait(cv, mu);
    return pthread_cond_timedwait(cv, mu, deadline);
}

int cx_msgq_init(cx_msgq_t *q, size_t max_n, size_t max_bytes)
{
    memset(q, 0, sizeof *q);
    pthread_mutex_init(&q->mu, NULL);
    cx_cond_init_mono(&q->cv);
    q->max_n = max_n;
    q->max_bytes = max_bytes;
    return CX_OK;
}

void cx_msgq_fini(cx_msgq_t *q)
{
    cx_msgq_item_t *it = q->head;
    while (it) {
        cx_msgq_item_t *n = it->next;
        free(it);
        it = n;
    }
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
}

int cx_msgq_push(cx_msgq_t *q, const cx_lid_t *from, const char *from_url, const void *data, size_t len)
{
    return cx_msgq_push_step(q, from, from_url, 0, 0, data, len);
}

int cx_msgq_push_step(cx_msgq_t *q, const cx_lid_t *from, const char *from_url, uint64_t from_incarnation,
                      uint64_t step, const void *data, size_t len)
{
    pthread_mutex_lock(&q->mu);
    /* An empty queue always takes one message, however large, so a message within CX_MSG_MAX can
     * always get through eventually. */
    if (q->n > 0 && (q->n >= q->max_n || q->bytes + len > q->max_bytes)) {
        pthread_mutex_unlock(&q->mu);
        return CX_EAGAIN;
    }
    pthread_mutex_unlock(&q->mu);
    cx_msgq_item_t *it = malloc(sizeof *it + len);
    if (!it) return CX_ENOMEM;
    it->from = *from;
    snprintf(it->from_url, sizeof it->from_url, "%s", from_url);
    it->len = len;
    it->step = step;
    it->from_incarnation = from_incarnation;
    it->next = NULL;
    if (len) memcpy(it + 1, data, len);
    pthread_mutex_lock(&q->mu);
    if (q->tail)
        q->tail->next = it;
    else
        q->head = it;
    q->tail = it;
    q->n++;
    q->bytes += len;
    if (q->wake_later)
        __atomic_store_n(&q->unwoken, 1, __ATOMIC_RELAXED);
    else
        pthread_cond_signal(&q->cv);
    pthread_mutex_unlock(&q->mu);
    return CX_OK;
}

void cx_msgq_defer_wake(cx_msgq_t *q)
{
    pthread_mutex_lock(&q->mu);
    q->wake_later = 1;
    pthread_mutex_unlock(&q->mu);
}

void cx_msgq_wake(cx_msgq_t *q)
{
    /* Pushes and wakes both run under the transports' lock (plock: the progress thread or a
     * driving caller, in a progress turn): a turn with no message pays one load. */
    if (!__atomic_load_n(&q->unwoken, __ATOMIC_RELAXED)) return;
    pthread_mutex_lock(&q->mu);
    __atomic_store_n(&q->unwoken, 0, __ATOMIC_RELAXED);
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

int cx_msgq_pop(cx_msgq_t *q, cx_msg_t *out, int timeout_ms)
{
    struct timespec dl;
    if (timeout_ms >= 0) cx_deadline_ms(&dl, timeout_ms);
    pthread_mutex_lock(&q->mu);
    while (!q->head && !q->closed)
        if (cx_cond_wait_ms(&q->cv, &q->mu, timeout_ms >= 0 ? &dl : NULL) == ETIMEDOUT) break;
    cx_msgq_item_t *it = q->head;
    if (!it) {
        int closed = q->closed;
        pthread_mutex_unlock(&q->mu);
        return closed ? CX_ECLOSED : CX_ETIMEDOUT;
    }
    q->head = it->next;
    if (!q->head) q->tail = NULL;
    q->n--;
    q->bytes -= it->len;
    pthread_mutex_unlock(&q->mu);
    /* Hand the caller a buffer of its own: the item is moved down so data starts the block. */
    out->from = it->from;
    memcpy(out->from_url, it->from_url, sizeof out->from_url);
    out->len = it->len;
    out->step = it->step;
    out->from_incarnation = it->from_incarnation;
    memmove(it, it + 1, it->len);
    out->data = it;
    return CX_OK;
}

void cx_msgq_close(cx_msgq_t *q)
{
    pthread_mutex_lock(&q->mu);
    q->closed = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}

size_t cx_msgq_len(cx_msgq_t *q)
{
    pthread_mutex_lock(&q->mu);
    size_t n = q->n;
    pthread_mutex_unlock(&q->mu);
    return n;
}

int cx_evq_init(cx_evq_t *q)
{
    memset(q, 0, sizeof *q);
    q->ring = calloc(CX_EVQ_CAP, sizeof *q->ring);
    if (!q->ring) return CX_ENOMEM;
    pthread_mutex_init(&q->mu, NULL);
    cx_cond_init_mono(&q->cv);
    return CX_OK;
}

void cx_evq_fini(cx_evq_t *q)
{
    free(q->ring);
    pthread_mutex_destroy(&q->mu);
    pthread_cond_destroy(&q->cv);
}

void cx_evq_push_locked(cx_evq_t *q, const cx_event_t *ev)
{
    if (q->n == CX_EVQ_CAP) {
        q->head = (q->head + 1) % CX_EVQ_CAP;
        q->n--;
        if (q->dropped++ % 1024 == 0)
            cx_warn("event queue full (%d): dropping the oldest events; call cx_wait_event", CX_EVQ_CAP);
    }
    q->ring[(q->head + q->n) % CX_EVQ_CAP] = *ev;
    q->n++;
    pthread_cond_broadcast(&q->cv);
}

int cx_evq_pop(cx_evq_t *q, cx_event_t *out, int timeout_ms)
{
    struct timespec dl;
    if (timeout_ms >= 0) cx_deadline_ms(&dl, timeout_ms);
    pthread_mutex_lock(&q->mu);
    while (q->n == 0 && !q->closed)
        if (cx_cond_wait_ms(&q->cv, &q->mu, timeout_ms >= 0 ? &dl : NULL) == ETIMEDOUT) break;
    if (q->n == 0) {
        int closed = q->closed;
        pthread_mutex_unlock(&q->mu);
        return closed ? CX_ECLOSED : CX_ETIMEDOUT;
    }
    *out = q->ring[q->head];
    q->head = (q->head + 1) % CX_EVQ_CAP;
    q->n--;
    pthread_mutex_unlock(&q->mu);
    return CX_OK;
}

void cx_evq_close(cx_evq_t *q)
{
    pthread_mutex_lock(&q->mu);
    q->closed = 1;
    pthread_cond_broadcast(&q->cv);
    pthread_mutex_unlock(&q->mu);
}
