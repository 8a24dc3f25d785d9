/* Test buffers in host, simulated-device or CUDA memory, so one test runs on every kind
 * (CONNEX_TEST_MEM=host|sim|cuda). Device bytes are reached through a host bounce buffer and
 * cx_gpu_memcpy: tests never dereference a device pointer. */
#ifndef CXT_MEM_H
#define CXT_MEM_H

#include <stddef.h>
#include <stdint.h>

#include "cx_gpu.h"

/* "host", "sim" or "cuda" -> CX_MEM_*; NULL or "" -> CX_MEM_HOST; -1 (and a message) otherwise.
 * Asking for sim switches the simulated device on in this process. */
int cxt_mem_parse(const char *s);
/* CONNEX_TEST_MEM, parsed as above, or `def` when unset. */
int cxt_mem_env(int def);
const char *cxt_mem_name(int kind);

/* Page-aligned memory of that kind (NULL and a message when it cannot be had). */
void *cxt_mem_alloc(int kind, size_t len);
void cxt_mem_free(int kind, void *p, size_t len);

/* The pattern / hash / check of cxt.h, on memory of any kind. 0 or -1. */
int cxt_mem_fill(void *p, size_t len, uint32_t seed, uint64_t start);
int cxt_mem_set(void *p, int c, size_t len);
uint64_t cxt_mem_hash(const void *p, size_t len);
/* Index of the first byte differing from the pattern, -1 when all match, -2 on a copy error. */
long long cxt_mem_check(const void *p, size_t len, uint32_t seed, uint64_t start);
/* One byte (guards around a transfer); -1 on a copy error. */
int cxt_mem_byte(const void *p);

#endif
