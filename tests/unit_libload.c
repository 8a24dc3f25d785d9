/* Which libraries a process loads: libfabric only once an engine opens its backend; libcrypto
 * only for an engine with an auth token, libcurl only for the etcd directory (core/src/dl_libs.c).
 *
 * Loading libfabric.so.1 costs about 200 ms on Debian 12 (its PSM dependencies time the CPU clock
 * in their constructors), so libconnex does not link it: the backend dlopens it at its first open
 * (backends/libfabric/fi_dl.c). The tests run in this order in one process, because once loaded
 * it stays. */
#include <connex/connex.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int mapped(const char *lib)
{
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[512];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) found = strstr(line, lib) != NULL;
    fclose(f);
    return found;
}

static cx_engine_t *engine(const char *backend)
{
    setenv("CONNEX_BACKEND", backend, 1);
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = "libload";
    c.listen_ip = "127.0.0.1";
    cx_engine_t *e = NULL;
    assert_int_equal(cx_engine_create(&c, &e), CX_OK);
    assert_non_null(e);
    assert_string_equal(cx_engine_backends(e), backend);
    return e;
}

/* A ZeroMQ engine: registers, is destroyed, and libfabric, libcrypto and libcurl were never in
 * the process. */
static void test_zmq_engine_leaves_libfabric_unloaded(void **state)
{
    (void)state;
    assert_false(mapped("libfabric.so"));
    cx_engine_t *e = engine("zmq");
    static char buf[4096];
    assert_int_equal(cx_register_memory(e, buf, sizeof buf), CX_OK);
    assert_int_equal(cx_unregister_memory(e, buf), CX_OK);
    assert_false(mapped("libfabric.so"));
    assert_false(mapped("libpsm"));
    assert_false(mapped("libcrypto.so"));
    assert_false(mapped("libcurl.so"));
    cx_engine_destroy(e);
    assert_false(mapped("libfabric.so"));
}

/* An engine with a token loads libcrypto for its HMAC, and only then. */
static void test_auth_token_loads_libcrypto(void **state)
{
    (void)state;
    setenv("CONNEX_BACKEND", "zmq", 1);
    cx_config_t c;
    memset(&c, 0, sizeof c);
    c.model = "libload";
    c.listen_ip = "127.0.0.1";
    c.auth_token = "libload-token-0123456789abcdef";
    cx_engine_t *e = NULL;
    assert_int_equal(cx_engine_create(&c, &e), CX_OK);
    assert_true(mapped("libcrypto.so"));
    assert_false(mapped("libcurl.so"));
    cx_engine_destroy(e);
}

#ifdef CX_HAVE_LIBFABRIC
/* The libfabric backend loads the library itself, then runs as before. */
static void test_libfabric_engine_loads_it(void **state)
{
    (void)state;
    setenv("CONNEX_FI_PROVIDER", "tcp;ofi_rxm", 1);
    cx_engine_t *e = engine("libfabric");
    assert_true(mapped("libfabric.so"));
    static char buf[4096];
    assert_int_equal(cx_register_memory(e, buf, sizeof buf), CX_OK);
    assert_int_equal(cx_unregister_memory(e, buf), CX_OK);
    cx_engine_destroy(e);
    /* a second engine of the process finds it loaded */
    e = engine("libfabric");
    cx_engine_destroy(e);
    unsetenv("CONNEX_FI_PROVIDER");
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_zmq_engine_leaves_libfabric_unloaded),
        cmocka_unit_test(test_auth_token_loads_libcrypto),
#ifdef CX_HAVE_LIBFABRIC
        cmocka_unit_test(test_libfabric_engine_loads_it),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
