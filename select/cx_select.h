/* select/: probe the host once, decide which backends an engine opens (best first), whether GPU
 * memory goes to the NIC directly, which RDMA NIC serves each GPU, and say why.
 *
 * The probe fills plain data (so policy tests feed synthetic probes); the policy functions are
 * pure: no environment, no I/O, same input -> same decision. Everything that reads the host or
 * the environment is named as such (cx_probe_host, cx_select_opts_from_env).
 */
#ifndef CX_SELECT_H
#define CX_SELECT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Exported: connex-probe and the selection tests use it through libconnex.so. */
#pragma GCC visibility push(default)

#define CX_SEL_MAX_RDMA 32 /* RDMA devices kept from sysfs (p5.48xlarge has 32 EFA NICs) */
#define CX_SEL_MAX_PORTS 4
#define CX_SEL_MAX_GPU 16
#define CX_SEL_MAX_BE 4 /* backends an engine opens at most */
#define CX_SEL_NAME 64
#define CX_SEL_PCI_DEPTH 12 /* root complex + bridges + device */

/* What a backend instance can reach peers with; advertised to peers, so bits are wire format. */
enum {
    CX_CAP_TCP = 1u << 0,
    CX_CAP_SHM = 1u << 1,  /* same-host shared memory / cma */
    CX_CAP_IB = 1u << 2,   /* RDMA over an InfiniBand port */
    CX_CAP_ROCE = 1u << 3, /* RDMA over an Ethernet (RoCE) port */
    CX_CAP_EFA = 1u << 4,  /* AWS EFA (SRD) */
    CX_CAP_GDR = 1u << 5   /* registers GPU memory with the NIC */
};
#define CX_CAP_RDMA (CX_CAP_IB | CX_CAP_ROCE | CX_CAP_EFA)

enum { CX_LINK_UNKNOWN = 0, CX_LINK_IB, CX_LINK_ETH, CX_LINK_EFA };

/* A library probed through dlopen: a missing one is a finding, never an error. */
typedef struct cx_probe_lib {
    int probed; /* 0: not looked at (compiled without its headers, or skipped) */
    int loaded; /* the shared library opened */
    char version[48];
    char note[160]; /* why it is absent / what failed */
} cx_probe_lib_t;

typedef struct cx_probe_pci {
    char bdf[16];                     /* "0000:1b:00.0"; "" when not a PCI device */
    int numa;                         /* -1: unknown */
    int depth;                        /* entries in chain */
    char chain[CX_SEL_PCI_DEPTH][16]; /* root complex ("pci0000:00") then each bridge, then bdf */
} cx_probe_pci_t;

typedef struct cx_probe_rdma {
    char name[CX_SEL_NAME]; /* "mlx5_0", "rdmap16s27" */
    char driver[32];        /* "mlx5_core", "efa" */
    int link;               /* CX_LINK_* of the best port */
    int nports;
    struct {
        int num;
        int active;
        int link;
    } ports[CX_SEL_MAX_PORTS];
    int active_port; /* first ACTIVE port number, 0: none */
    int verbs_ok;    /* libibverbs lists it (a user-space provider exists); -1 unknown */
    cx_probe_pci_t pci;
} cx_probe_rdma_t;

typedef struct cx_probe_gpu {
    int ordinal; /* CUDA device ordinal; -1 when only sysfs saw it */
    char name[CX_SEL_NAME];
    int gdr_attr;    /* CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED; -1 unknown */
    int dmabuf_attr; /* CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED; -1 unknown */
    cx_probe_pci_t pci;
} cx_probe_gpu_t;

typedef struct cx_probe {
    char sysfs_root[128];
    char host_id[128]; /* hostname/boot_id: equal on two engines = same host */
    /* backends compiled into this libconnex, best first (cx_backends_builtin) */
    int n_built;
    char built[CX_SEL_MAX_BE][16];

    cx_probe_lib_t verbs, fabric, ucx, cuda;
    int n_rdma;
    cx_probe_rdma_t rdma[CX_SEL_MAX_RDMA];

    /* libfabric: FI_EP_RDM providers with FI_RMA|FI_MSG */
    char fi_providers[256]; /* "efa,tcp;ofi_rxm,shm" */
    int fi_efa, fi_efa_hmem, fi_verbs, fi_verbs_hmem, fi_tcp, fi_shm;

    /* UCX: transports seen by uct ("rc_mlx5/mlx5_0:1,tcp/lo,cma/memory,...") */
    char ucx_resources[512];
    unsigned ucx_caps; /* CX_CAP_* the transports give (IB/ROCE from the devices) */
    int ucx_cuda;      /* cuda_copy (UCX knows CUDA memory) */
    int ucx_gdr_copy;

    int n_gpu;
    cx_probe_gpu_t gpu[CX_SEL_MAX_GPU];
    int peermem; /* nvidia_peermem (or nv_peer_mem) loaded */

    char notes[1024];   /* other findings, one per line */
    unsigned libs_done; /* CX_PROBE_* already probed (cx_probe_host_libs) */
} cx_probe_t;

/* The library probes, each costly (dlopen, and libfabric's first fi_getinfo reads
 * /proc/kallsyms: about 100 ms here): an engine with a forced backend runs only its own. */
enum { CX_PROBE_VERBS = 1, CX_PROBE_FABRIC = 2, CX_PROBE_UCX = 4, CX_PROBE_CUDA = 8, CX_PROBE_LIBS = 15 };

/* Probe this host. sysfs_root NULL = "/sys" (tests pass a synthetic tree). Never fails because
 * something is missing: each absence is recorded in the probe. Returns CX_OK, or CX_EINVAL for a
 * NULL probe. CONNEX_PROBE_CUDA=0 skips cuInit (it costs time and memory in the process). */
int cx_probe_host(cx_probe_t *p, const char *sysfs_root);
/* cx_probe_host in two steps: the host (built backends, host id, sysfs), then the library probes
 * in `libs` (CX_PROBE_*) not yet run on p; a library never probed keeps probed 0 and a note
 * saying so. cx_probe_host(p, r) = cx_probe_host_base(p, r) + cx_probe_host_libs(p, r, ALL). */
int cx_probe_host_base(cx_probe_t *p, const char *sysfs_root);
int cx_probe_host_libs(cx_probe_t *p, const char *sysfs_root, unsigned libs);
/* Only the sysfs part (RDMA devices, PCI topology, GPUs seen by PCI id, peermem module). */
int cx_probe_sysfs(cx_probe_t *p, const char *sysfs_root);

/* ---------------- policy ---------------- */

typedef struct cx_choice {
    char backend[16]; /* "ucx", "libfabric", "zmq" */
    char variant[48]; /* libfabric provider ("efa", "tcp;ofi_rxm"); ucx/zmq: "" */
    unsigned caps;    /* CX_CAP_* this instance reaches peers with */
} cx_choice_t;

typedef struct cx_select_opts {
    const char *backend;     /* NULL/"auto" | "ucx" | "libfabric" | "zmq" */
    const char *net_devices; /* CONNEX_NET_DEVICES: "mlx5_0,mlx5_1:1" or "gpu0=mlx5_2,..." */
    const char *gdr;         /* CONNEX_GDR: NULL/"auto" | "0" | "1" */
    const char *fi_provider; /* CONNEX_FI_PROVIDER: forces the libfabric provider */
} cx_select_opts_t;

/* The plan for one backend the engine opens: exactly what its open is given
 * (cx_backend_params_t), and what it means for GPU memory. */
typedef struct cx_plan_be {
    char provider[48];        /* libfabric: the provider it opens; "" for the others */
    char domain[CX_SEL_NAME]; /* libfabric: the domain (NIC) it opens; "": the provider's
                                   own (tcp binds to the engine's address, shm has one) */
    char devices[256];        /* UCX: its RDMA devices ("mlx5_0:1,..."); "": none (TCP and
                                   shared memory over the engine's interface) */
    int devices_exact;        /* devices is the user's CONNEX_NET_DEVICES list, used as given */
    char domains[256];        /* libfabric on RDMA: every NIC of the provider's kind, the rails
                                   it opens and stripes over, `domain` first ("": one domain) */
    char gpu_domains[512];    /* libfabric: each GPU's rails, "0=mlx5_0;1=mlx5_1" (CUDA ordinal
                                   = its nearest NIC(s)); "": none */
    char transports[64];      /* what it carries peers over ("rc,dc,ud (ib)", "efa", "tcp") */
    int gpudirect;            /* GPU (CUDA) memory registered with the NIC by this backend */
    char gpudirect_via[96];   /* the capabilities behind it, or why it is off */
} cx_plan_be_t;

typedef struct cx_decision {
    int n;
    cx_choice_t be[CX_SEL_MAX_BE];       /* open these, in this order */
    const char *backends[CX_SEL_MAX_BE]; /* be[i].backend, for convenience */
    char same_host[16];                  /* backend for same-host peers ("" = the normal order) */
    int gpudirect;                       /* 1: register GPU memory with the NIC; 0: stage through host */
    int n_gpu;
    int nic_of_gpu[CX_SEL_MAX_GPU];   /* index into probe->rdma, -1: none */
    char net_devices[256];            /* the NICs in use, UCX_NET_DEVICES syntax ("mlx5_0:1,...") */
    cx_plan_be_t plan[CX_SEL_MAX_BE]; /* plan[i]: what be[i] opens (cx_select_plan) */
    char error[256];                  /* set when the decision failed: what is missing */
    char reasons[4096];               /* one reason per line */
} cx_decision_t;

/* Fill opts from CONNEX_BACKEND (wins over cfg_backend, as connex.h says), CONNEX_NET_DEVICES,
 * CONNEX_GDR, CONNEX_FI_PROVIDER as the environment holds them now (connex-probe; an engine uses
 * the table it parsed at create). The strings stay valid until the next call. */
void cx_select_opts_from_env(cx_select_opts_t *o, const char *cfg_backend);

/* The policy. CX_OK and a decision with n >= 1; CX_EINVAL for a malformed option (unknown
 * backend name, bad CONNEX_NET_DEVICES); CX_EUNSUPPORTED when nothing usable exists or a forced
 * backend/GPUDirect cannot run (d->error names what is missing; no silent fallback). */
int cx_select_decide_opts(const cx_probe_t *p, const cx_select_opts_t *o, cx_decision_t *d);
int cx_select_decide(const cx_probe_t *p, const char *forced, cx_decision_t *d);

/* The plan of each decided backend (called by the policy once the rest is decided; public for
 * tests): d->plan[i] for d->be[i]. */
void cx_select_plan(const cx_probe_t *p, const cx_select_opts_t *o, cx_decision_t *d);

/* NIC per GPU (called by the policy; public for tests). cand_caps selects the NICs eligible
 * (CX_CAP_IB|CX_CAP_ROCE or CX_CAP_EFA). */
int cx_select_nics(const cx_probe_t *p, unsigned cand_caps, const char *override, cx_decision_t *d);

/* ---------------- per pair ----------------
 * What an engine advertises for each open backend: "backend/variant/caps" (e.g.
 * "libfabric/efa/0x30"), short enough for a wire str8. */
int cx_choice_format(const cx_choice_t *c, char *buf, size_t len);
int cx_choice_parse(const char *s, cx_choice_t *c);

/* Order the backends two engines share, best first. Symmetric: both ends compute the same order
 * from the two advertisements, so they agree without a negotiation round. `order` receives
 * indices into `mine`. Returns the count (0: nothing in common); `why` (optional) explains. */
int cx_select_pair(const cx_choice_t *mine, int n_mine, const cx_choice_t *theirs, int n_theirs, int same_host,
                   int *order, char *why, size_t why_len);

/* ---------------- the engine's entry point ----------------
 * Probe (sysfs root from CONNEX_SYSFS_ROOT, default /sys), decide with the environment's
 * overrides over cfg_backend (read now; cx_engine_create uses cx_select_for_engine_opts with
 * the table it parsed), log the decision at info level, and fill out[] with the compiled-in
 * ops in the decided order. Returns the count (>= 1) or a negative CX_* code (the log and, when
 * dec is given, dec->error say what is missing). dec (optional) receives the decision: variants,
 * GPUDirect, NIC per GPU, what to advertise (cx_choice_format of dec->be[i]). */
struct cx_backend_ops;
/* This host's id from the (cached) probe: equal on two engines = same host. */
const char *cx_select_host_id(void);
int cx_select_for_engine(const char *cfg_backend, const struct cx_backend_ops **out, int max, cx_decision_t *dec);

/* ---------------- reporting ---------------- */
size_t cx_select_caps_str(unsigned caps, char *buf, size_t len); /* "tcp,shm,ib" */
/* Human text / JSON of the probe and decision (rc is cx_select_decide's return). Return the
 * length that the full text needs (snprintf-like); output is always NUL-terminated. */
size_t cx_select_report_text(const cx_probe_t *p, const cx_decision_t *d, int rc, char *buf, size_t len);
size_t cx_select_report_json(const cx_probe_t *p, const cx_decision_t *d, int rc, char *buf, size_t len);
/* The plan alone (connex-probe --plan): what each backend's open is given. */
size_t cx_select_report_plan(const cx_probe_t *p, const cx_decision_t *d, int rc, char *buf, size_t len);
/* The decision and its reasons at info level (what cx_engine_create logs). */
void cx_select_log(const cx_probe_t *p, const cx_decision_t *d, int rc);

#pragma GCC visibility pop

/* Internal to libconnex: the same entry points over a parsed CONNEX_* table (connex/options.h)
 * instead of the environment: cx_engine_create passes its own, so that the selection sees the
 * values the engine checked at create. */
struct cx_opts;
void cx_select_opts_from(cx_select_opts_t *o, const struct cx_opts *opts, const char *cfg_backend);
const char *cx_select_host_id_opts(const struct cx_opts *opts);
int cx_select_for_engine_opts(const struct cx_opts *opts, const char *cfg_backend, const struct cx_backend_ops **out,
                              int max, cx_decision_t *dec);

#ifdef __cplusplus
}
#endif
#endif
