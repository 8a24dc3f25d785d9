/* Unit tests of the step envelope and the receiver's duplicate window (core/src/mobility/step.c):
 * no process, no network; a zeroed engine and peer stand in for the real ones. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "mobility/mobility.h"
#include "mobility/step.h"

static void test_window(void **state)
{
    (void)state;
    cx_step_win_t w;
    memset(&w, 0, sizeof w);
    assert_int_equal(cx_step_win_accept(&w, 0), 0); /* 0 is never a step */
    assert_int_equal(cx_step_win_accept(&w, 1), 1);
    assert_int_equal(cx_step_win_accept(&w, 1), 0); /* duplicate */
    assert_int_equal(cx_step_win_accept(&w, 5), 1); /* a gap: 2..4 not seen yet */
    assert_int_equal(cx_step_win_accept(&w, 3), 1); /* late, but new */
    assert_int_equal(cx_step_win_accept(&w, 3), 0);
    assert_int_equal(cx_step_win_accept(&w, 2), 1);
    assert_int_equal(cx_step_win_accept(&w, 5), 0);
    /* Slide the window far: everything older than CX_STEP_WINDOW below the top counts as seen. */
    assert_int_equal(cx_step_win_accept(&w, 10 + CX_STEP_WINDOW), 1);
    assert_int_equal(cx_step_win_accept(&w, 4), 0);  /* too old to tell */
    assert_int_equal(cx_step_win_accept(&w, 11), 1); /* inside the window, never seen */
    assert_int_equal(cx_step_win_accept(&w, 10), 0); /* exactly WINDOW below: too old */
    /* Undo (the message could not be queued): the same id is new again. */
    assert_int_equal(cx_step_win_accept(&w, 12), 1);
    cx_step_win_undo(&w, 12);
    assert_int_equal(cx_step_win_accept(&w, 12), 1);
    /* A slide by less than the window keeps the ids in between unseen, the old ones seen. */
    uint64_t top = w.top;
    assert_int_equal(cx_step_win_accept(&w, top + 100), 1);
    for (uint64_t k = top + 1; k < top + 100; k++) assert_int_equal(cx_step_win_accept(&w, k), 1);
    assert_int_equal(cx_step_win_accept(&w, top), 0);
    /* Every id of a long increasing run is new exactly once. */
    memset(&w, 0, sizeof w);
    for (uint64_t k = 1; k <= 3 * CX_STEP_WINDOW; k++) assert_int_equal(cx_step_win_accept(&w, k), 1);
    for (uint64_t k = 2 * CX_STEP_WINDOW + 1; k <= 3 * CX_STEP_WINDOW; k++)
        assert_int_equal(cx_step_win_accept(&w, k), 0);
}

static void mkpeer(cx_peer_t *p, uint32_t replica, uint64_t inc)
{
    memset(p, 0, sizeof *p);
    snprintf(p->lid.model, sizeof p->lid.model, "m");
    p->lid.replica = replica;
    snprintf(p->url, sizeof p->url, "127.0.0.1:1#m|0|0|%u", replica);
    p->incarnation = inc;
}

static void test_accept(void **state)
{
    (void)state;
    cx_engine_t *e = calloc(1, sizeof *e);
    assert_non_null(e);
    e->incarnation = 0x1234567890abcdefull;
    cx_peer_t a, b;
    mkpeer(&a, 1, 111);
    mkpeer(&b, 2, 222);
    uint8_t m[CX_STEP_HDR + 3];
    memcpy(m + CX_STEP_HDR, "abc", 3);
    const void *pl;
    size_t plen;
    uint64_t step;

    cx_step_hdr_put(m, e->incarnation, 7);
    assert_int_equal(cx_step_accept(e, &a, m, sizeof m, &pl, &plen, &step), 1);
    assert_ptr_equal(pl, m + CX_STEP_HDR);
    assert_int_equal(plen, 3);
    assert_int_equal(step, 7);
    assert_int_equal(cx_step_accept(e, &a, m, sizeof m, &pl, &plen, &step), 2); /* duplicate */
    assert_int_equal(e->st.steps_duplicates_dropped, 1);
    /* Another sender's id 7 is its own. */
    assert_int_equal(cx_step_accept(e, &b, m, sizeof m, &pl, &plen, &step), 1);
    /* The same sender, restarted: its ids start over. */
    a.incarnation = 112;
    assert_int_equal(cx_step_accept(e, &a, m, sizeof m, &pl, &plen, &step), 1);
    /* Refused by a full queue, then sent again: accepted again. */
    cx_step_unaccept(e, &a, 7);
    assert_int_equal(cx_step_accept(e, &a, m, sizeof m, &pl, &plen, &step), 1);

    /* Not for this engine (another incarnation), no magic, too short, id 0: plain messages. */
    cx_step_hdr_put(m, e->incarnation + 1, 8);
    assert_int_equal(cx_step_accept(e, &a, m, sizeof m, &pl, &plen, &step), 0);
    assert_ptr_equal(pl, m);
    assert_int_equal(plen, sizeof m);
    assert_int_equal(step, 0);
    cx_step_hdr_put(m, e->incarnation, 8);
    m[0] ^= 1;
    assert_int_equal(cx_step_accept(e, &a, m, sizeof m, &pl, &plen, &step), 0);
    m[0] ^= 1;
    assert_int_equal(cx_step_accept(e, &a, m, CX_STEP_HDR - 1, &pl, &plen, &step), 0);
    cx_step_hdr_put(m, e->incarnation, 0);
    assert_int_equal(cx_step_accept(e, &a, m, sizeof m, &pl, &plen, &step), 0);
    /* A header and nothing else is an empty step. */
    cx_step_hdr_put(m, e->incarnation, 9);
    assert_int_equal(cx_step_accept(e, &a, m, CX_STEP_HDR, &pl, &plen, &step), 1);
    assert_int_equal(plen, 0);
    assert_int_equal(e->st.steps_duplicates_dropped, 1);

    cx_step_forget_peer(e, &b);
    assert_non_null(e->steps_rx);
    cx_step_forget_peer(e, NULL);
    assert_null(e->steps_rx);
    free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window),
        cmocka_unit_test(test_accept),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
