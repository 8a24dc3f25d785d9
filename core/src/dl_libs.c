/* libcrypto and libcurl, dlopen'ed at first use (dl_libs.h says why). Each is loaded once per
 * process (pthread_once) and never unloaded: both keep global state (OpenSSL's provider tables,
 * curl_global_init's) that must outlive any engine that used them. */
#define CX_DL_CURL 1
#include "dl_libs.h"

#include "connex/backend.h"
#include "connex/connex.h"
#include "connex/log.h"
#include "sigkeep.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef CX_CRYPTO_SONAME
#define CX_CRYPTO_SONAME "libcrypto.so.3"
#endif
#ifndef CX_CURL_SONAME
#define CX_CURL_SONAME "libcurl.so.4"
#endif

/* dlsym into a function pointer without an object -> function pointer cast */
#define CX_DL_SYM(h, var, name, miss)                                    \
    do {                                                                 \
        if (!(*(void **)(&(var)) = dlsym((h), (name)))) (miss) = (name); \
    } while (0)

/* A constructor may install signal handlers (libucs's take SIGSEGV, SIGBUS, SIGILL, SIGFPE and
 * SIGHUP): what the load changed is put back, so the process keeps its own dispositions whoever
 * loads the library, an engine or not. The dispositions are saved and restored around the call
 * only: a thread of the application that sets one at the same moment may see it undone. */
void *cx_core_dlopen(const char *soname, char *why, size_t wn)
{
    cx_sigkeep_t *k = malloc(sizeof *k);
    if (k) cx_sigkeep_save(k);
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    const char *e = h ? NULL : dlerror();
    if (!h && why && wn) snprintf(why, wn, "%s", e ? e : "not found");
    if (k) {
        char who[96];
        snprintf(who, sizeof who, "loading %s", soname);
        cx_sigkeep_restore(k, who);
    }
    free(k);
    return h;
}

static void *dl_open(const char *soname, char *why, size_t wn)
{
    return cx_core_dlopen(soname, why, wn);
}

/* ---------------------------------------------------------------- libcrypto */

struct evp_md_st;
static struct {
    const struct evp_md_st *(*sha256)(void);
    unsigned char *(*hmac)(const struct evp_md_st *, const void *, int, const unsigned char *, size_t, unsigned char *,
                           unsigned int *);
    int ok;
} crypto;
static pthread_once_t crypto_once = PTHREAD_ONCE_INIT;

static void crypto_load_once(void)
{
    char why[200] = "";
    const char *miss = NULL;
    void *h = dl_open(CX_CRYPTO_SONAME, why, sizeof why);
    if (h) {
        CX_DL_SYM(h, crypto.sha256, "EVP_sha256", miss);
        CX_DL_SYM(h, crypto.hmac, "HMAC", miss);
        if (miss) snprintf(why, sizeof why, "%s lacks %s", CX_CRYPTO_SONAME, miss);
    }
    crypto.ok = h && !miss;
    if (!crypto.ok) cx_error("auth: libcrypto (%s) not usable: %s", CX_CRYPTO_SONAME, why);
}

int cx_crypto_load(void)
{
    pthread_once(&crypto_once, crypto_load_once);
    return crypto.ok ? CX_OK : CX_EUNSUPPORTED;
}

int cx_hmac_sha256(const void *key, size_t key_len, const uint8_t *msg, size_t n, uint8_t out[32])
{
    unsigned int mlen = 0;
    if (cx_crypto_load() || key_len > 0x7fffffff) return CX_ERR;
    if (!crypto.hmac(crypto.sha256(), key, (int)key_len, msg, n, out, &mlen) || mlen != 32) return CX_ERR;
    return CX_OK;
}

/* ---------------------------------------------------------------- libcurl */

struct cx_curl_fns cx_curl;
static int curl_ok;
static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_load_once(void)
{
    char why[200] = "";
    const char *miss = NULL;
    void *h = dl_open(CX_CURL_SONAME, why, sizeof why);
    if (h) {
        struct cx_curl_fns *f = &cx_curl;
        CX_DL_SYM(h, f->global_init, "curl_global_init", miss);
        CX_DL_SYM(h, f->easy_init, "curl_easy_init", miss);
        CX_DL_SYM(h, f->easy_setopt, "curl_easy_setopt", miss);
        CX_DL_SYM(h, f->easy_perform, "curl_easy_perform", miss);
        CX_DL_SYM(h, f->easy_getinfo, "curl_easy_getinfo", miss);
        CX_DL_SYM(h, f->easy_strerror, "curl_easy_strerror", miss);
        CX_DL_SYM(h, f->easy_cleanup, "curl_easy_cleanup", miss);
        CX_DL_SYM(h, f->multi_init, "curl_multi_init", miss);
        CX_DL_SYM(h, f->multi_add_handle, "curl_multi_add_handle", miss);
        CX_DL_SYM(h, f->multi_remove_handle, "curl_multi_remove_handle", miss);
        CX_DL_SYM(h, f->multi_perform, "curl_multi_perform", miss);
        CX_DL_SYM(h, f->multi_info_read, "curl_multi_info_read", miss);
        CX_DL_SYM(h, f->multi_poll, "curl_multi_poll", miss);
        CX_DL_SYM(h, f->multi_wakeup, "curl_multi_wakeup", miss);
        CX_DL_SYM(h, f->multi_cleanup, "curl_multi_cleanup", miss);
        CX_DL_SYM(h, f->slist_append, "curl_slist_append", miss);
        CX_DL_SYM(h, f->slist_free_all, "curl_slist_free_all", miss);
        if (miss)
            snprintf(why, sizeof why, "%s lacks %s (libcurl 7.68 or newer is needed)", CX_CURL_SONAME, miss);
        else if (cx_curl.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
            snprintf(why, sizeof why, "curl_global_init failed");
            miss = "init";
        }
    }
    curl_ok = h && !miss;
    if (!curl_ok) cx_error("directory: libcurl (%s) not usable: %s", CX_CURL_SONAME, why);
}

int cx_curl_load(void)
{
    pthread_once(&curl_once, curl_load_once);
    return curl_ok ? CX_OK : CX_EUNSUPPORTED;
}
