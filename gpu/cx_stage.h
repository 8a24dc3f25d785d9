/* The staging pipeline: moves a transfer between device memory and the network through a ring of
 * pinned host slots, chunk by chunk, so that the copy of chunk i+1 overlaps the network transfer
 * of chunk i.
 *
 *   OUT (device -> network: the source of a write/put_signal, the target of a remote read):
 *       slot <- D2H copy of chunk i; chunk callback (bytes are in c->host: send them);
 *       the caller calls cx_stage_chunk_done when the network is done with the slot.
 *   IN  (network -> device: the destination of a read, the target of a write/put_signal):
 *       chunk callback (c->host is a free slot: receive chunk i into it); the caller calls
 *       cx_stage_chunk_done when the bytes are there; then H2D copy; the job's done callback
 *       runs only after the last H2D copy finished (so a put_signal message delivered from it
 *       comes after the data is in device memory).
 *
 * Threading: one thread (the core's progress thread) drives a cx_stage_t; nothing here blocks.
 * Callbacks run only inside cx_stage_progress(), never inside start/chunk_done/cancel (those
 * only record and wake the fd), so a callback may call any cx_stage_* function. Call
 * cx_stage_progress() when cx_stage_fd() is readable, and right after a batch of chunk_done
 * calls to save a wake-up.
 *
 * Slot accounting: a job holds at most `per_job` slots; jobs waiting for slots are served round
 * robin. A failed chunk (chunk_done with an error), a failed copy or cx_stage_cancel ends the
 * job: no new chunk starts, slots come back as their copies and network parts finish, and the
 * done callback runs (with the first error) once the job holds no slot. The caller must still
 * call chunk_done for every chunk callback it got (a backend completes every xfer when it
 * disconnects, so a dead peer returns every slot).
 */
#ifndef CX_STAGE_H
#define CX_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "cx_gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { CX_STAGE_OUT = 0, CX_STAGE_IN = 1 };

/* OUT only: give the last chunk's callback only after every other chunk's chunk_done, so the
 * caller can send it as the put_signal that must arrive after all the data. */
#define CX_STAGE_LAST_AFTER_ALL 0x1u
/* Chunks of the ring's full size, never split smaller for overlap: the job is itself one piece
 * of a pipeline that overlaps elsewhere (a target's range for a peer that stages too). */
#define CX_STAGE_WHOLE 0x2u

typedef struct cx_stage cx_stage_t;
typedef struct cx_stage_job cx_stage_job_t;

typedef struct cx_stage_cfg { /* zero = environment or default */
    size_t chunk;             /* CONNEX_STAGE_CHUNK (bytes, K/M suffix), default 4 MiB */
    uint32_t slots;           /* CONNEX_STAGE_SLOTS, default 8 */
    uint32_t per_job;         /* CONNEX_STAGE_PER_JOB, default slots/2 (at least 2) */
    size_t min_chunk;         /* a transfer shorter than 8 chunks is cut into 8 pieces of at
                                  least this (default 256 KiB), so its copies still overlap */
} cx_stage_cfg_t;

typedef struct cx_stage_chunk {
    cx_stage_job_t *job;
    void *job_arg;  /* the cbs.arg of the job */
    uint32_t index; /* 0 .. nchunks-1 */
    uint32_t nchunks;
    size_t off; /* offset in the transfer */
    size_t len; /* bytes of this chunk (the last may be short; a transfer of
                                  fewer than 8 full chunks uses smaller ones, see min_chunk) */
    void *host; /* the slot (inside the ring) */
    int last;   /* index == nchunks - 1 */
} cx_stage_chunk_t;

typedef struct cx_stage_cbs {
    void (*chunk)(const cx_stage_chunk_t *c);
    /* Every slot of the job is back; the job is freed when this returns. */
    void (*done)(void *arg, cx_stage_job_t *job, int status);
    void *arg;
} cx_stage_cbs_t;

typedef struct cx_stage_stats {
    uint64_t h2d_bytes, d2h_bytes; /* bytes copied by the copy engine, per direction */
    uint64_t jobs_ok, jobs_failed;
    uint32_t slots, slots_free;
    size_t chunk;
} cx_stage_stats_t;

/* A pipeline for device memory of `kind` (CX_MEM_CUDA or CX_MEM_SIM) on `device`. Allocates the
 * ring (slots * chunk pinned bytes, one contiguous block: register it with the backends once). */
int cx_stage_create(int kind, int device, const cx_stage_cfg_t *cfg, cx_stage_t **out);
/* Cancels every job (CX_ECLOSED), waits for copies in flight, runs the done callbacks of jobs
 * that could finish, frees the rest with a warning, frees the ring. */
void cx_stage_destroy(cx_stage_t *st);
int cx_stage_fd(const cx_stage_t *st);
void cx_stage_ring(const cx_stage_t *st, void **base, size_t *len);
void cx_stage_get_stats(const cx_stage_t *st, cx_stage_stats_t *out); /* any thread */

/* Stage len bytes at device address dev (inside one allocation of this stage's kind and device)
 * in direction dir. flags: CX_STAGE_LAST_AFTER_ALL, CX_STAGE_WHOLE. CX_EINVAL for bad arguments (logged). */
int cx_stage_start(cx_stage_t *st, int dir, void *dev, size_t len, unsigned flags, const cx_stage_cbs_t *cbs,
                   cx_stage_job_t **out);
/* The network part of chunk `index` finished (status CX_OK or an error). */
void cx_stage_chunk_done(cx_stage_job_t *job, uint32_t index, int status);
/* End the job with `status` (an error) as soon as its slots come back. */
void cx_stage_cancel(cx_stage_job_t *job, int status);
/* Handle copy completions and run callbacks. Returns the number of jobs still alive. */
int cx_stage_progress(cx_stage_t *st);

#ifdef __cplusplus
}
#endif
#endif
