/* Bounded queues from the progress thread to callers: received messages and peer events. */
#ifndef CX_QUEUE_H
#define CX_QUEUE_H

#include "connex/connex.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cx_msgq_item {
    cx_lid_t from;
    char from_url[CX_URL_MAX];
    size_t len;
    uint64_t step, from_incarnation; /* cx_msg_t's */
    struct cx_msgq_item *next;
    /* data follows */
} cx_msgq_item_t;

typedef struct cx_msgq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    cx_msgq_item_t *head, *tail;
    size_t n, bytes, max_n, max_bytes;
    int closed;
    int wake_later; /* cx_msgq_defer_wake: pushes leave the waiter asleep until cx_msgq_wake */
    int unwoken;    /* pushed since the last wake, with wake_later */
} cx_msgq_t;

int cx_msgq_init(cx_msgq_t *q, size_t max_n, size_t max_bytes);
void cx_msgq_fini(cx_msgq_t *q);
/* CX_OK, CX_EAGAIN when full (the sender is told; nothing is dropped), CX_ENOMEM. */
int cx_msgq_push(cx_msgq_t *q, const cx_lid_t *from, const char *from_url, const void *data, size_t len);
/* The same, with the sender's incarnation and the group step id (0: a plain message). */
int cx_msgq_push_step(cx_msgq_t *q, const cx_lid_t *from, const char *from_url, uint64_t from_incarnation,
                      uint64_t step, const void *data, size_t len);
int cx_msgq_pop(cx_msgq_t *q, cx_msg_t *out, int timeout_ms);
/* Pushes from now on wake no waiter: cx_msgq_wake does, later. The progress thread delivers a
 * message and then answers its sender (the ack of a message or put_signal carries the push's
 * status); waking the receiving thread first put a futex wake, and on a small host often that
 * thread itself, between the delivery and the ack (docs/semantics.md). */
void cx_msgq_defer_wake(cx_msgq_t *q);
void cx_msgq_wake(cx_msgq_t *q);  /* wakes a waiter if a push since the last one left it asleep */
void cx_msgq_close(cx_msgq_t *q); /* wakes waiters; pops then return CX_ECLOSED when empty */
size_t cx_msgq_len(cx_msgq_t *q);

#define CX_EVQ_CAP 4096
typedef struct cx_evq {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    cx_event_t *ring;
    size_t head, n;
    uint64_t dropped;
    int closed;
} cx_evq_t;

int cx_evq_init(cx_evq_t *q);
void cx_evq_fini(cx_evq_t *q);
/* Pushes with q->mu already held, so that a decision and its push are one critical section.
 * Full: drops the oldest, counted, logged. */
void cx_evq_push_locked(cx_evq_t *q, const cx_event_t *ev);
int cx_evq_pop(cx_evq_t *q, cx_event_t *out, int timeout_ms);
void cx_evq_close(cx_evq_t *q);

/* Deadline helpers for condition waits on CLOCK_MONOTONIC. */
void cx_cond_init_mono(pthread_cond_t *cv);
int cx_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, const struct timespec *deadline);
void cx_deadline_ms(struct timespec *ts, int timeout_ms);

#endif
