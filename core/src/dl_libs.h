/* Libraries only some engines need, loaded at their first use instead of with libconnex:
 * libcrypto (HMAC-SHA256, for control-channel authentication) and libcurl (the etcd directory).
 * Linked, the two and what they pull in (libssl, gnutls, kerberos, ldap, ...: 30 of the 48
 * libraries of a process linked with libconnex) cost every process 10-25 ms between exec and
 * main (core/README.md "Start-up"), whether it authenticates or uses etcd or not. */
#ifndef CX_DL_LIBS_H
#define CX_DL_LIBS_H

#include <stddef.h>
#include <stdint.h>

/* CX_OK once libcrypto is loaded with what auth.c calls; CX_EUNSUPPORTED (logged once) if not. */
int cx_crypto_load(void);
/* HMAC-SHA256 of msg under key into out[32]; CX_OK or CX_ERR. */
int cx_hmac_sha256(const void *key, size_t key_len, const uint8_t *msg, size_t n, uint8_t out[32]);

#ifdef CX_DL_CURL
#include <curl/curl.h>
/* The libcurl functions dir_etcd.c calls, looked up once by cx_curl_load. */
struct cx_curl_fns {
    CURLcode (*global_init)(long);
    CURL *(*easy_init)(void);
    CURLcode (*easy_setopt)(CURL *, CURLoption, ...);
    CURLcode (*easy_perform)(CURL *);
    CURLcode (*easy_getinfo)(CURL *, CURLINFO, ...);
    const char *(*easy_strerror)(CURLcode);
    void (*easy_cleanup)(CURL *);
    CURLM *(*multi_init)(void);
    CURLMcode (*multi_add_handle)(CURLM *, CURL *);
    CURLMcode (*multi_remove_handle)(CURLM *, CURL *);
    CURLMcode (*multi_perform)(CURLM *, int *);
    CURLMsg *(*multi_info_read)(CURLM *, int *);
    CURLMcode (*multi_poll)(CURLM *, struct curl_waitfd[], unsigned int, int, int *);
    CURLMcode (*multi_wakeup)(CURLM *);
    CURLMcode (*multi_cleanup)(CURLM *);
    struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
    void (*slist_free_all)(struct curl_slist *);
};
extern struct cx_curl_fns cx_curl;
#endif
/* CX_OK once libcurl is loaded and curl_global_init ran; CX_EUNSUPPORTED (logged) if not. */
int cx_curl_load(void);

#endif
