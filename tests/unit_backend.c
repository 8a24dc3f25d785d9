/* The core's check of a backend's interface version (core/src/gpu_hook.h, cx_backend_check): a
 * backend built against another CX_BACKEND_API_VERSION is refused, and every built-in one passes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "connex/backend.h"
#include "gpu_hook.h"

static void test_wrong_version_refused(void **state)
{
    (void)state;
    struct cx_backend_ops newer = { .version = CX_BACKEND_API_VERSION + 1, .name = "fake" };
    struct cx_backend_ops unset = { .name = "fake" }; /* a table that never set .version */
    struct cx_backend_ops unnamed = { .version = CX_BACKEND_API_VERSION + 7 };
    assert_int_equal(cx_backend_check(&newer), CX_EUNSUPPORTED);
    assert_int_equal(cx_backend_check(&unset), CX_EUNSUPPORTED);
    assert_int_equal(cx_backend_check(&unnamed), CX_EUNSUPPORTED);
    assert_int_equal(cx_backend_check(NULL), CX_EINVAL);
}

static void test_right_version_accepted(void **state)
{
    (void)state;
    struct cx_backend_ops same = { .version = CX_BACKEND_API_VERSION, .name = "fake" };
    assert_int_equal(cx_backend_check(&same), CX_OK);
}

static void test_builtin_backends_accepted(void **state)
{
    (void)state;
    for (int i = 0; cx_backends_builtin[i]; i++) {
        assert_int_equal(cx_backends_builtin[i]->version, CX_BACKEND_API_VERSION);
        assert_int_equal(cx_backend_check(cx_backends_builtin[i]), CX_OK);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wrong_version_refused),
        cmocka_unit_test(test_right_version_accepted),
        cmocka_unit_test(test_builtin_backends_accepted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
