/* libfabric, loaded when the backend first needs it instead of with libconnex.
 *
 * Why: loading Debian 12's libfabric.so.1 runs the constructors of the PSM libraries it links
 * (libpsm_infinipath, libpsm2), each of which times the CPU clock with usleep for about 100 ms:
 * 204 ms per process on this VM (a bare dlopen, measured), paid at exec by every program linked
 * with connex-c, whatever backend it uses. With CONNEX_BACKEND=zmq or ucx the selection layer
 * never probes libfabric either (select/engine_glue.c), so such a process now never loads it.
 *
 * Only five libfabric functions are called through the dynamic linker; everything else
 * (fi_domain, fi_read, fi_cq_read, ...) is an inline call through the fid's ops table. With
 * libfabric 1.x headers each is looked up at the symbol version a link against them binds
 * (FABRIC_1.3, 1.1, 1.0: the struct layouts these headers describe); with other headers, at the
 * library's default version, which is the one of the headers it ships with. The library is
 * never unloaded: its providers keep state (and threads) for the process's life. */
#include "fi_int.h"

#include "connex/log.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

static struct {
    int (*getinfo)(uint32_t, const char *, const char *, uint64_t, const struct fi_info *, struct fi_info **);
    void (*freeinfo)(struct fi_info *);
    struct fi_info *(*dupinfo)(const struct fi_info *);
    int (*fabric)(struct fi_fabric_attr *, struct fid_fabric **, void *);
    const char *(*strerror)(int);
    int ok;
    char why[160];
} lib;
static pthread_once_t lib_once = PTHREAD_ONCE_INIT;

static void *sym(void *h, const char *name, const char *version)
{
#if FI_MAJOR_VERSION == 1
    void *p = dlvsym(h, name, version);
    return p ? p : dlsym(h, name); /* a library built without symbol versions */
#else
    (void)version;
    return dlsym(h, name);
#endif
}

/* dlsym into a function pointer without an object -> function pointer cast */
#define CX_FI_SYM(h, var, name, ver) (*(void **)(&(var)) = sym((h), (name), (ver)))

static void lib_load(void)
{
    const char *name = "libfabric.so.1";
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) {
        const char *e = dlerror();
        snprintf(lib.why, sizeof lib.why, "%s not loadable: %s", name, e ? e : "?");
        return;
    }
    CX_FI_SYM(h, lib.getinfo, "fi_getinfo", "FABRIC_1.3");
    CX_FI_SYM(h, lib.freeinfo, "fi_freeinfo", "FABRIC_1.3");
    CX_FI_SYM(h, lib.dupinfo, "fi_dupinfo", "FABRIC_1.3");
    CX_FI_SYM(h, lib.fabric, "fi_fabric", "FABRIC_1.1");
    CX_FI_SYM(h, lib.strerror, "fi_strerror", "FABRIC_1.0");
    if (!lib.getinfo || !lib.freeinfo || !lib.dupinfo || !lib.fabric || !lib.strerror) {
        snprintf(lib.why, sizeof lib.why,
                 "%s lacks fi_getinfo, fi_freeinfo, fi_dupinfo, fi_fabric "
                 "or fi_strerror",
                 name);
        return;
    }
    lib.ok = 1;
}

static void lib_load_once(void)
{
    lib_load();
    if (!lib.ok) cx_info("libfabric: %s", lib.why);
}

int cx_fi_lib_load(void)
{
    pthread_once(&lib_once, lib_load_once);
    return lib.ok ? CX_OK : CX_EUNSUPPORTED;
}

/* The backend's open loads the library first; the wrappers check again (pthread_once: a load
 * word after the first call) so that none can call through a NULL pointer. */
int cx_fi_getinfo(uint32_t version, const char *node, const char *service, uint64_t flags, const struct fi_info *hints,
                  struct fi_info **info)
{
    if (cx_fi_lib_load()) return -FI_ENOSYS;
    return lib.getinfo(version, node, service, flags, hints, info);
}

void cx_fi_freeinfo(struct fi_info *info)
{
    if (info && !cx_fi_lib_load()) lib.freeinfo(info);
}

struct fi_info *cx_fi_dupinfo(const struct fi_info *info)
{
    return cx_fi_lib_load() ? NULL : lib.dupinfo(info);
}

int cx_fi_fabric(struct fi_fabric_attr *attr, struct fid_fabric **fabric, void *context)
{
    if (cx_fi_lib_load()) return -FI_ENOSYS;
    return lib.fabric(attr, fabric, context);
}

const char *cx_fi_strerror(int errnum)
{
    return cx_fi_lib_load() ? "libfabric not loadable" : lib.strerror(errnum);
}
