/* UCX, dlopen'ed at the backend's first open instead of linked with libconnex.
 *
 * Why: libucs's constructor installs handlers for SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGHUP
 * (its error and debug signals). Linked, it did so in every process linked with connex-c,
 * whatever backend it used, before main: a library must not change its host process. Loaded
 * here through cx_core_dlopen, the process's dispositions are put back right after the load
 * (core/src/dl_libs.c), and a process that never opens the UCX backend never loads UCX.
 *
 * The libraries are never unloaded: UCX does not support it (libucm's memory hooks, the
 * constructors' global state). UCX has no symbol versions; the headers built against give each
 * function's type (ucx_dl.h). */
#include "ucx_dl.h"

#include "connex/backend.h"
#include "connex/connex.h"
#include "connex/log.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#ifndef CX_UCP_SONAME
#define CX_UCP_SONAME "libucp.so.0"
#endif
#ifndef CX_UCS_SONAME
#define CX_UCS_SONAME "libucs.so.0"
#endif

struct cx_ucx_fns cx_ucx_lib;
static int lib_ok;
static pthread_once_t lib_once = PTHREAD_ONCE_INIT;

/* The process's global scope first, as the dynamic linker bound these names when UCX was linked:
 * a program that defines one of them (plan_open interposes ucp_config_modify), or links UCX itself,
 * gets the functions it got before. Then the library loaded here (RTLD_LOCAL). */
static void *sym(void *h, const char *name)
{
    void *p = dlsym(RTLD_DEFAULT, name);
    return p ? p : dlsym(h, name);
}

static void lib_load_once(void)
{
    char why[256] = "";
    const char *miss = NULL;
    /* libucp first: it pulls in libucs, libuct and libucm, whose constructors run here */
    void *ucp = cx_core_dlopen(CX_UCP_SONAME, why, sizeof why);
    void *ucs = ucp ? cx_core_dlopen(CX_UCS_SONAME, why, sizeof why) : NULL;
    if (ucp && ucs) {
        /* dlsym into a function pointer without an object -> function pointer cast */
#define CX_UCX_FN_SYM(lib, f) \
    if (!(*(void **)(&cx_ucx_lib.f) = sym(lib, #f)) && !miss) miss = #f;
        CX_UCX_FNS(CX_UCX_FN_SYM)
#undef CX_UCX_FN_SYM
        if (miss) snprintf(why, sizeof why, "%s or %s lacks %s", CX_UCP_SONAME, CX_UCS_SONAME, miss);
    }
    lib_ok = ucp && ucs && !miss;
    if (!lib_ok) cx_warn("ucx: UCX not usable: %s", why);
}

int cx_ucx_lib_load(void)
{
    pthread_once(&lib_once, lib_load_once);
    return lib_ok ? CX_OK : CX_EUNSUPPORTED;
}
