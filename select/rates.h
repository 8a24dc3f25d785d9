/* Measured rates behind the policy's "fastest by measurement" rules, in one place so that a new
 * benchmark changes the policy by changing a number here (and in docs/selection.md).
 * GB/s, 16 MiB one-sided read, on the project's 2-vCPU Debian 12 VM.
 * 0 = not measured: ranks after every measured path. Each backend's entry in backends.c names
 * its figures. */
#ifndef CX_SELECT_RATES_H
#define CX_SELECT_RATES_H

/* TCP between hosts (each raw library driven by a small standalone probe program) */
#define CX_RATE_TCP_LIBFABRIC 3.6 /* libfabric tcp;ofi_rxm fi_read */
#define CX_RATE_TCP_UCX 1.1       /* UCX tcp ucp_get */
#define CX_RATE_TCP_ZMQ 1.1       /* ZeroMQ PAIR, request/response */
/* Same host, as the backends run it (connex-bench transfer, two processes): what a pair on one
 * host really gets, not what the raw library can do. UCX 1.13 gives an endpoint created with
 * peer error handling (which the backend needs to see a peer die) no shared-memory lane: one
 * tcp/lo lane, whatever UCX_TLS lists (raw UCX cma reads 12.6 GB/s; the backend 1.1). */
#define CX_RATE_SAMEHOST_LIBFABRIC_SHM 8.2 /* libfabric shm provider (16 KiB: 6.6 us) */
#define CX_RATE_SAMEHOST_LIBFABRIC_TCP 1.9 /* libfabric tcp;ofi_rxm over loopback */
#define CX_RATE_SAMEHOST_UCX 1.1           /* UCX, one tcp/lo lane (16 KiB: 106-125 us) */
#define CX_RATE_SAMEHOST_ZMQ 0.0           /* not measured */
/* RDMA: not measurable here; between two RDMA paths the class decides, then the name order */
#define CX_RATE_RDMA_UCX 0.0
#define CX_RATE_RDMA_LIBFABRIC 0.0

#endif
