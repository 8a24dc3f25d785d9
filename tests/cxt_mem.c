/* Test buffers of every memory kind (see cxt_mem.h). */
#include "cxt_mem.h"

#include "cxt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int cxt_mem_parse(const char *s)
{
    if (!s || !*s || !strcmp(s, "host")) return CX_MEM_HOST;
    if (!strcmp(s, "sim")) {
        cx_gpu_sim_enable(1);
        return CX_MEM_SIM;
    }
    if (!strcmp(s, "cuda")) return CX_MEM_CUDA;
    fprintf(stderr, "cxt: memory kind '%s' is not host, sim or cuda\n", s);
    return -1;
}

int cxt_mem_env(int def)
{
    const char *s = getenv("CONNEX_TEST_MEM");
    if (!s || !*s) {
        if (def == CX_MEM_SIM) cx_gpu_sim_enable(1);
        return def;
    }
    return cxt_mem_parse(s);
}

const char *cxt_mem_name(int kind)
{
    return cx_mem_kind_name(kind);
}

void *cxt_mem_alloc(int kind, size_t len)
{
    if (kind == CX_MEM_HOST) {
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    void *p = NULL;
    int rc = cx_gpu_dev_alloc(kind, 0, len, &p);
    if (rc) {
        fprintf(stderr, "cxt: %zu bytes of %s memory: %s (%s)\n", len, cx_mem_kind_name(kind), cx_strerror(rc),
                cx_gpu_status());
        return NULL;
    }
    return p;
}

void cxt_mem_free(int kind, void *p, size_t len)
{
    if (!p) return;
    if (kind == CX_MEM_HOST)
        munmap(p, len);
    else
        cx_gpu_dev_free(p);
}

/* Bounce buffers: 4 MiB at a time keeps a 64 MiB fill from doubling the test's footprint. */
#define BOUNCE ((size_t)4 << 20)

int cxt_mem_fill(void *p, size_t len, uint32_t seed, uint64_t start)
{
    uint8_t *b = malloc(len < BOUNCE ? len : BOUNCE);
    if (!b) return -1;
    for (size_t off = 0; off < len;) {
        size_t n = len - off < BOUNCE ? len - off : BOUNCE;
        cxt_fill(b, n, seed, start + off);
        if (cx_gpu_memcpy((uint8_t *)p + off, b, n)) {
            free(b);
            return -1;
        }
        off += n;
    }
    free(b);
    return 0;
}

int cxt_mem_set(void *p, int c, size_t len)
{
    return cx_gpu_memset(p, c, len) ? -1 : 0;
}

/* FNV-1a 64, continued across pieces (same value as cxt_hash over the whole range). */
uint64_t cxt_mem_hash(const void *p, size_t len)
{
    uint8_t *b = malloc(len < BOUNCE ? (len ? len : 1) : BOUNCE);
    uint64_t h = 0xcbf29ce484222325ULL;
    if (!b) return 0;
    for (size_t off = 0; off < len;) {
        size_t n = len - off < BOUNCE ? len - off : BOUNCE;
        if (cx_gpu_memcpy(b, (const uint8_t *)p + off, n)) {
            free(b);
            return 0;
        }
        for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
        off += n;
    }
    free(b);
    return h;
}

long long cxt_mem_check(const void *p, size_t len, uint32_t seed, uint64_t start)
{
    uint8_t *b = malloc(len < BOUNCE ? (len ? len : 1) : BOUNCE);
    if (!b) return -2;
    for (size_t off = 0; off < len;) {
        size_t n = len - off < BOUNCE ? len - off : BOUNCE;
        if (cx_gpu_memcpy(b, (const uint8_t *)p + off, n)) {
            free(b);
            return -2;
        }
        long long bad = cxt_check(b, n, seed, start + off);
        if (bad >= 0) {
            free(b);
            return (long long)off + bad;
        }
        off += n;
    }
    free(b);
    return -1;
}

int cxt_mem_byte(const void *p)
{
    uint8_t v;
    return cx_gpu_memcpy(&v, p, 1) ? -1 : v;
}
