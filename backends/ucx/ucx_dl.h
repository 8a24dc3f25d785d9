/* UCX, loaded at the backend's first open instead of with libconnex (ucx_dl.c says why).
 *
 * Every UCX function the backend calls goes through cx_ucx_lib, whose members have the names
 * and the types of the functions the UCX headers declare: `cx_ucx_lib.ucp_worker_progress(w)`.
 * The headers are still included for the types, macros and constants; no UCX symbol is linked. */
#ifndef CX_UCX_DL_H
#define CX_UCX_DL_H

#include <ucp/api/ucp.h>
#include <ucs/debug/log_def.h>

/* X(library, function): every UCX function the backend calls. ucp_init is an inline function of
 * ucp.h that calls ucp_init_version: cx_ucx_init below does the same through the table. */
#define CX_UCX_FNS(X)                      \
    X(ucp, ucp_am_recv_data_nbx)           \
    X(ucp, ucp_am_send_nbx)                \
    X(ucp, ucp_cleanup)                    \
    X(ucp, ucp_config_modify)              \
    X(ucp, ucp_config_read)                \
    X(ucp, ucp_config_release)             \
    X(ucp, ucp_context_query)              \
    X(ucp, ucp_ep_close_nbx)               \
    X(ucp, ucp_ep_create)                  \
    X(ucp, ucp_ep_flush_nbx)               \
    X(ucp, ucp_ep_print_info)              \
    X(ucp, ucp_ep_rkey_unpack)             \
    X(ucp, ucp_get_nbx)                    \
    X(ucp, ucp_get_version)                \
    X(ucp, ucp_get_version_string)         \
    X(ucp, ucp_init_version)               \
    X(ucp, ucp_mem_map)                    \
    X(ucp, ucp_mem_unmap)                  \
    X(ucp, ucp_put_nbx)                    \
    X(ucp, ucp_request_check_status)       \
    X(ucp, ucp_request_free)               \
    X(ucp, ucp_rkey_buffer_release)        \
    X(ucp, ucp_rkey_destroy)               \
    X(ucp, ucp_rkey_pack)                  \
    X(ucp, ucp_worker_arm)                 \
    X(ucp, ucp_worker_create)              \
    X(ucp, ucp_worker_destroy)             \
    X(ucp, ucp_worker_get_address)         \
    X(ucp, ucp_worker_get_efd)             \
    X(ucp, ucp_worker_progress)            \
    X(ucp, ucp_worker_release_address)     \
    X(ucp, ucp_worker_set_am_recv_handler) \
    X(ucs, ucs_log_push_handler)           \
    X(ucs, ucs_status_string)

#define CX_UCX_FN_MEMBER(lib, f) __typeof__(f) *f;
struct cx_ucx_fns {
    CX_UCX_FNS(CX_UCX_FN_MEMBER)
};
#undef CX_UCX_FN_MEMBER
/* Filled once by cx_ucx_lib_load; read-only afterwards. */
extern struct cx_ucx_fns cx_ucx_lib;

/* CX_OK once libucp.so.0 and libucs.so.0 are loaded with every function of CX_UCX_FNS;
 * CX_EUNSUPPORTED (logged once) if not. Loads once per process; the libraries stay. */
int cx_ucx_lib_load(void);

static inline ucs_status_t cx_ucx_init(const ucp_params_t *params, const ucp_config_t *config, ucp_context_h *ctx)
{
    return cx_ucx_lib.ucp_init_version(UCP_API_MAJOR, UCP_API_MINOR, params, config, ctx);
}

#endif
