/* Poll windows (core/src/spin.h): CONNEX_POLL_US parsing, and a transfer's window, which grows
 * with its size so that a caller polls a large op to its end instead of sleeping on it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <unistd.h>

#include "spin.h"

static uint64_t default_ns(void)
{
    return sysconf(_SC_NPROCESSORS_ONLN) >= CX_POLL_MIN_CPUS ? CX_POLL_US_DEFAULT * 1000ull : 0;
}

/* The window an engine created now would take: the environment through the options table. */
static uint64_t window_now(void)
{
    static cx_opts_t o;
    (void)cx_opts_load(&o); /* a bad value: logged, and left unset */
    return cx_spin_window_ns(&o);
}

static void test_window_from_env(void **state)
{
    (void)state;
    setenv("CONNEX_POLL_US", "50", 1);
    assert_int_equal(window_now(), 50000);
    setenv("CONNEX_POLL_US", "0", 1);
    assert_int_equal(window_now(), 0);
    setenv("CONNEX_POLL_US", "100000", 1);
    assert_int_equal(window_now(), 100000000ull);
    /* Out of range or not a number: logged, and the default kept. */
    static const char *bad[] = { "-1", "100001", "5x", "x", " 7" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        setenv("CONNEX_POLL_US", bad[i], 1);
        assert_int_equal(window_now(), default_ns());
    }
    unsetenv("CONNEX_POLL_US");
    assert_int_equal(window_now(), default_ns());
}

static void test_window_grows_with_size(void **state)
{
    (void)state;
    /* No window stays none, whatever the size: the caller sleeps at once. */
    assert_int_equal(cx_spin_for_len(0, 0), 0);
    assert_int_equal(cx_spin_for_len(0, 16u << 20), 0);
    /* The window, plus the bytes at CX_POLL_BYTES_PER_US. */
    assert_int_equal(cx_spin_for_len(50000, 0), 50000);
    assert_int_equal(cx_spin_for_len(50000, 4096), 50000 + 4096 / CX_POLL_BYTES_PER_US * 1000);
    assert_int_equal(cx_spin_for_len(50000, 1u << 20), 50000 + (1u << 20) / CX_POLL_BYTES_PER_US * 1000ull);
    uint64_t w16 = cx_spin_for_len(50000, 16u << 20);
    assert_true(w16 > 16000000ull && w16 < 17000000ull); /* 16 MiB at 1 GB/s: about 16.8 ms */
    /* Monotonic in size, and never past the cap (unless the window itself is larger). */
    uint64_t prev = 0;
    for (uint64_t len = 1; len <= (1ull << 40); len <<= 4) {
        uint64_t w = cx_spin_for_len(50000, len);
        assert_true(w >= prev);
        assert_true(w <= CX_POLL_MAX_NS);
        prev = w;
    }
    assert_int_equal(cx_spin_for_len(50000, UINT64_MAX), CX_POLL_MAX_NS);
    assert_int_equal(cx_spin_for_len(CX_POLL_MAX_NS * 2, 1u << 20), CX_POLL_MAX_NS * 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_window_from_env),
        cmocka_unit_test(test_window_grows_with_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
