/* Internal to gpu/: the sim allocation table. */
#ifndef CX_GPU_SIM_H
#define CX_GPU_SIM_H

#include <stddef.h>
#include <stdint.h>

/* 1 and the allocation holding p, or 0. */
int cx_sim_lookup(uintptr_t p, uintptr_t *base, size_t *len);

#endif
