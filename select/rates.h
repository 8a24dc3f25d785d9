/* Measured rates behind the policy's "fastest by measurement" rules, in one place so that a new
 * benchmark changes the policy by changing a number here (and in docs/selection.md).
 * GB/s, 16 MiB one-sided read, loopback, on the project's 2-vCPU Debian 12 VM (each raw
 * library driven by a small standalone probe program, docs/selection.md).
 * 0 = not measured: ranks after every measured path. */
#ifndef CX_SELECT_RATES_H
#define CX_SELECT_RATES_H

/* TCP between hosts */
#define CX_RATE_TCP_LIBFABRIC 3.6   /* libfabric tcp;ofi_rxm fi_read */
#define CX_RATE_TCP_UCX 1.1         /* UCX tcp ucp_get */
#define CX_RATE_TCP_ZMQ 1.1         /* ZeroMQ PAIR, request/response */
/* same host */
#define CX_RATE_SHM_UCX 12.6        /* UCX cma ucp_get, malloc memory */
#define CX_RATE_SHM_LIBFABRIC 0.0   /* libfabric shm fi_read: not measured yet */
/* RDMA: not measurable here; between two RDMA paths the class decides, then the name order */
#define CX_RATE_RDMA_UCX 0.0
#define CX_RATE_RDMA_LIBFABRIC 0.0

#endif
