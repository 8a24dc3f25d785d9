/* The receive queue (core/src/queue.c): bounds, order, and the deferred wake the engine uses, by
 * which a delivered message wakes its receiver only after the progress turn sent the ack. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "queue.h"

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static const cx_lid_t lid = { "m", 1, 0, 0 };

static void test_bounds_and_order(void **state)
{
    (void)state;
    cx_msgq_t q;
    cx_msgq_init(&q, 2, 1 << 20);
    assert_int_equal(cx_msgq_push(&q, &lid, "u", "a", 1), CX_OK);
    assert_int_equal(cx_msgq_push(&q, &lid, "u", "bb", 2), CX_OK);
    assert_int_equal(cx_msgq_push(&q, &lid, "u", "c", 1), CX_EAGAIN); /* full: refused, not dropped */
    cx_msg_t m;
    assert_int_equal(cx_msgq_pop(&q, &m, 0), CX_OK);
    assert_int_equal(m.len, 1);
    assert_memory_equal(m.data, "a", 1);
    free(m.data);
    assert_int_equal(cx_msgq_pop(&q, &m, 0), CX_OK);
    assert_int_equal(m.len, 2);
    free(m.data);
    assert_int_equal(cx_msgq_pop(&q, &m, 0), CX_ETIMEDOUT);
    cx_msgq_fini(&q);
}

typedef struct {
    cx_msgq_t *q;
    int rc;
    double got_ms;
} waiter_t;

static void *waiter(void *arg)
{
    waiter_t *w = arg;
    cx_msg_t m;
    w->rc = cx_msgq_pop(w->q, &m, 5000);
    w->got_ms = now_ms();
    if (w->rc == CX_OK) free(m.data);
    return NULL;
}

/* Deferred: the message is in the queue at once (a pop finds it), a sleeping receiver is woken by
 * cx_msgq_wake, and a wake with nothing pushed since is a no-op. */
static void test_deferred_wake(void **state)
{
    (void)state;
    cx_msgq_t q;
    cx_msgq_init(&q, 16, 1 << 20);
    cx_msgq_defer_wake(&q);
    cx_msgq_wake(&q); /* nothing pushed: nothing to do */
    assert_int_equal(cx_msgq_push(&q, &lid, "u", "x", 1), CX_OK);
    assert_int_equal(cx_msgq_len(&q), 1);
    cx_msg_t m;
    assert_int_equal(cx_msgq_pop(&q, &m, 0), CX_OK); /* there, unwoken or not */
    free(m.data);

    waiter_t w = { .q = &q, .rc = 99 };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, waiter, &w), 0);
    struct timespec ts = { 0, 100 * 1000000L };
    nanosleep(&ts, NULL); /* the waiter is asleep by now, most likely */
    assert_int_equal(cx_msgq_push(&q, &lid, "u", "y", 1), CX_OK);
    double t0 = now_ms();
    cx_msgq_wake(&q);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(w.rc, CX_OK);
    assert_true(w.got_ms - t0 < 1000.0); /* woken, not its 5 s timeout */
    cx_msgq_fini(&q);
}

/* Closing wakes a waiter whatever the wake mode. */
static void test_close_wakes(void **state)
{
    (void)state;
    cx_msgq_t q;
    cx_msgq_init(&q, 16, 1 << 20);
    cx_msgq_defer_wake(&q);
    waiter_t w = { .q = &q, .rc = 99 };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, waiter, &w), 0);
    struct timespec ts = { 0, 50 * 1000000L };
    nanosleep(&ts, NULL);
    double t0 = now_ms();
    cx_msgq_close(&q);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(w.rc, CX_ECLOSED);
    assert_true(w.got_ms - t0 < 1000.0);
    cx_msgq_fini(&q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bounds_and_order),
        cmocka_unit_test(test_deferred_wake),
        cmocka_unit_test(test_close_wakes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
