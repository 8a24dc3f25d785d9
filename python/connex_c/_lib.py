"""Loading libconnex and declaring the C API for ctypes.

The structures below mirror core/include/connex/connex.h field for field; tests/test_layout.py
compiles a probe against the header (when a C compiler is present) and compares every size and
offset, so a header change that is not mirrored here fails a test instead of corrupting memory.

ctypes.CDLL (not PyDLL) drops the GIL around every foreign call: a thread blocked in
cx_recv_msg or cx_wait_event does not stop the other Python threads.
"""

import ctypes
import ctypes.util
import glob
import os

CX_OK = 0
CX_ERR = -1
CX_EPEER = -2
CX_ETIMEDOUT = -3
CX_EINVAL = -4
CX_ENOMEM = -5
CX_EUNSUPPORTED = -6
CX_ECLOSED = -7
CX_EAUTH = -8
CX_EAGAIN = -9
CX_EINPROGRESS = -10   # cx_op_wait / cx_group_wait: the wait expired, the op is still valid

CX_MODEL_MAX = 64
CX_URL_MAX = 160
CX_MSG_MAX = 64 << 20
CX_BATCH_MAX = 1 << 16     # most entries in one batch
CX_OPK_NAMES = ("read", "write", "put_signal", "msg")
CX_OPK_COUNT = len(CX_OPK_NAMES)
EVENT_NAMES = ("up", "joined", "failed", "suspect", "left", "moved")
CX_CLASS_CRITICAL = 0     # traffic classes (cx_class_t)
CX_CLASS_BACKGROUND = 1
CX_PICK_ROUND_ROBIN = 0   # group pick policies (cx_pick_t)
CX_PICK_LEAST_INFLIGHT = 1
CX_MEM_HOST = 0           # memory kinds (cx_mem_kind)
CX_MEM_CUDA = 1
CX_MEM_SIM = 2
MEM_KIND_NAMES = ("host", "cuda", "sim")


class LibraryNotFound(ImportError):
    """libconnex.so could not be located or loaded."""


class cx_lid_t(ctypes.Structure):
    _fields_ = [("model", ctypes.c_char * CX_MODEL_MAX),
                ("stage", ctypes.c_uint32),
                ("shard", ctypes.c_uint32),
                ("replica", ctypes.c_uint32)]

    def as_tuple(self):
        return (self.model.decode("utf-8", "replace"), self.stage, self.shard, self.replica)


class cx_config_t(ctypes.Structure):
    _fields_ = [("model", ctypes.c_char_p),
                ("stage", ctypes.c_uint32),
                ("shard", ctypes.c_uint32),
                ("replica", ctypes.c_uint32),
                ("listen_ip", ctypes.c_char_p),
                ("port", ctypes.c_uint16),
                ("backend", ctypes.c_char_p),
                ("heartbeat_ms", ctypes.c_uint32),
                ("heartbeat_timeout_ms", ctypes.c_uint32),
                ("op_timeout_ms", ctypes.c_uint32),
                ("connect_timeout_ms", ctypes.c_uint32),
                ("recv_queue_max", ctypes.c_uint32),
                ("recv_queue_bytes", ctypes.c_uint64),
                ("auth_token", ctypes.c_char_p),
                ("directory", ctypes.c_char_p),
                ("peers", ctypes.c_char_p),
                ("lease_ms", ctypes.c_uint32),
                ("credits_critical", ctypes.c_uint32),
                ("credits_background", ctypes.c_uint32),
                ("background_chunk", ctypes.c_uint32),
                ("classes_off", ctypes.c_int),
                ("advertise_ip", ctypes.c_char_p)]


class cx_msg_t(ctypes.Structure):
    _fields_ = [("from_", cx_lid_t),
                ("from_url", ctypes.c_char * CX_URL_MAX),
                ("data", ctypes.c_void_p),
                ("len", ctypes.c_size_t),
                ("step", ctypes.c_uint64),
                ("from_incarnation", ctypes.c_uint64)]


class cx_batch_entry_t(ctypes.Structure):
    _fields_ = [("peer", ctypes.c_char_p),
                ("local", ctypes.c_void_p),
                ("remote", ctypes.c_uint64),
                ("len", ctypes.c_size_t)]


class cx_event_t(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int),
                ("peer", cx_lid_t),
                ("url", ctypes.c_char * CX_URL_MAX),
                ("reason", ctypes.c_char * 128),
                ("incarnation", ctypes.c_uint64),
                ("time_ns", ctypes.c_uint64)]


_K = ctypes.c_uint64 * CX_OPK_COUNT


class cx_stats_t(ctypes.Structure):
    _fields_ = [("peers_connecting", ctypes.c_uint32),
                ("peers_up", ctypes.c_uint32),
                ("peers_suspect", ctypes.c_uint32),
                ("peers_failed", ctypes.c_uint32),
                ("peers_left", ctypes.c_uint32),
                ("regions", ctypes.c_uint64),
                ("registered_bytes", ctypes.c_uint64),
                ("ops_in_flight", ctypes.c_uint64),
                ("peer_failures", ctypes.c_uint64),
                ("peer_joins", ctypes.c_uint64),
                ("op_timeouts", ctypes.c_uint64),
                ("ops", _K),
                ("op_errors", _K),
                ("bytes", _K),
                ("served_ops", _K),
                ("served_bytes", _K),
                ("rejected_requests", ctypes.c_uint64),
                ("msgs_queued", ctypes.c_uint64),
                ("msgs_refused", ctypes.c_uint64),
                ("events_dropped", ctypes.c_uint64),
                ("auth_refused", ctypes.c_uint64),
                ("staged_h2d_bytes", ctypes.c_uint64),
                ("staged_d2h_bytes", ctypes.c_uint64),
                ("gpudirect", ctypes.c_int),
                ("steps_handed_over", ctypes.c_uint64),
                ("steps_duplicates_dropped", ctypes.c_uint64),
                ("directory_changes", ctypes.c_uint64),
                ("background_chunks", ctypes.c_uint64),
                ("background_deferred", ctypes.c_uint64),
                ("ops_driven", ctypes.c_uint64),
                ("ops_driven_done", ctypes.c_uint64)]


class cx_peer_info_t(ctypes.Structure):
    _fields_ = [("lid", cx_lid_t),
                ("url", ctypes.c_char * CX_URL_MAX),
                ("state", ctypes.c_int),
                ("backend", ctypes.c_char * 16),
                ("why", ctypes.c_char * 192),
                ("incarnation", ctypes.c_uint64),
                ("ops_in_flight", ctypes.c_uint64),
                ("same_host", ctypes.c_int),
                ("death_watch", ctypes.c_int),
                ("transport", ctypes.c_char * 64)]


class cx_dir_entry_t(ctypes.Structure):
    _fields_ = [("lid", cx_lid_t),
                ("url", ctypes.c_char * CX_URL_MAX),
                ("version", ctypes.c_uint64)]


STRUCTS = {"cx_lid_t": cx_lid_t, "cx_config_t": cx_config_t, "cx_msg_t": cx_msg_t,
           "cx_event_t": cx_event_t, "cx_stats_t": cx_stats_t, "cx_peer_info_t": cx_peer_info_t,
           "cx_dir_entry_t": cx_dir_entry_t, "cx_batch_entry_t": cx_batch_entry_t}

_P = ctypes.c_void_p
_S = ctypes.c_char_p
_I = ctypes.c_int
_Z = ctypes.c_size_t
_U64 = ctypes.c_uint64

# name: (restype, argtypes)
_PROTOTYPES = {
    "cx_strerror": (_S, [_I]),
    "cx_engine_create": (_I, [ctypes.POINTER(cx_config_t), ctypes.POINTER(_P)]),
    "cx_engine_destroy": (None, [_P]),
    "cx_engine_local_url": (_S, [_P]),
    "cx_engine_backends": (_S, [_P]),
    "cx_engine_incarnation": (_U64, [_P]),
    "cx_connect": (_I, [_P, _S, _I]),
    "cx_peer_backend": (_S, [_P, _S]),
    "cx_peer_state": (_I, [_P, _S]),
    "cx_peer_list": (_I, [_P, ctypes.POINTER(cx_peer_info_t), _I]),
    "cx_register_memory": (_I, [_P, _P, _Z]),
    "cx_mem_kind": (_I, [_P, _Z]),
    "cx_mem_alloc": (_I, [_I, _I, _Z, ctypes.POINTER(_P)]),
    "cx_mem_free": (None, [_P]),
    "cx_mem_copy": (_I, [_P, _P, _Z]),
    "cx_peer_first_region": (_I, [_P, _S, ctypes.POINTER(_U64), ctypes.POINTER(_U64)]),
    "cx_unregister_memory": (_I, [_P, _P]),
    "cx_read": (_I, [_P, _S, _P, _U64, _Z]),
    "cx_write": (_I, [_P, _S, _P, _U64, _Z]),
    "cx_put_signal": (_I, [_P, _S, _P, _U64, _Z, _P, _Z, ctypes.POINTER(_P)]),
    "cx_op_wait": (_I, [_P, _I]),
    "cx_read_async": (_I, [_P, _S, _P, _U64, _Z, _I, ctypes.POINTER(_P)]),
    "cx_write_async": (_I, [_P, _S, _P, _U64, _Z, _I, ctypes.POINTER(_P)]),
    # batches: entries (cx_batch_entry_t array), count, statuses (int array)
    "cx_batch_read": (_I, [_P, _P, _Z, _P]),
    "cx_batch_write": (_I, [_P, _P, _Z, _P]),
    "cx_batch_put_signal": (_I, [_P, _S, _P, _Z, _P, _Z, _I, _P, ctypes.POINTER(_P)]),
    "cx_send_msg": (_I, [_P, _S, _P, _Z]),
    "cx_recv_msg": (_I, [_P, ctypes.POINTER(cx_msg_t), _I]),
    "cx_msg_release": (None, [ctypes.POINTER(cx_msg_t)]),
    "cx_wait_event": (_I, [_P, ctypes.POINTER(cx_event_t), _I]),
    "cx_event_name": (_S, [_I]),
    "cx_stats": (_I, [_P, ctypes.POINTER(cx_stats_t)]),
    "cx_stats_format": (_I, [_P, ctypes.c_char_p, _Z]),
    "cx_lid_parse": (_I, [_S, ctypes.POINTER(cx_lid_t), ctypes.c_char_p, _Z]),
    "cx_log_set_level": (None, [_I]),
    # mobility: directory and replica groups (python/connex_c/group.py)
    "cx_directory_list": (_I, [_P, _S, ctypes.POINTER(cx_dir_entry_t), _I]),
    "cx_directory_kind": (_S, [_P]),
    "cx_group_open": (_I, [_P, _S, _I, ctypes.POINTER(_P)]),
    "cx_group_close": (None, [_P]),
    "cx_group_add": (_I, [_P, _S]),
    "cx_group_members": (_I, [_P, ctypes.POINTER(cx_lid_t), ctypes.POINTER(_I), _I]),
    "cx_group_pick": (_I, [_P, ctypes.POINTER(cx_lid_t)]),
    "cx_group_mark_failed": (_I, [_P, _S]),
    "cx_group_send": (_I, [_P, _P, _Z, ctypes.POINTER(_P)]),
    "cx_group_put_signal": (_I, [_P, _P, _Z, _U64, _P, _Z, ctypes.POINTER(_P)]),
    "cx_group_wait": (_I, [_P, _I, ctypes.POINTER(cx_lid_t), ctypes.POINTER(_U64)]),
}


def _candidates():
    """Where libconnex may be, in the order the package README documents."""
    env = os.environ.get("CONNEX_LIB")
    if env:
        if os.path.isdir(env):
            env = os.path.join(env, "libconnex.so")
        return [("CONNEX_LIB", env)], True
    found = []
    here = os.path.dirname(os.path.abspath(__file__))
    _searched[:] = ["CONNEX_LIB (unset)"]
    # Next to the package: a wheel or a copy that carries its own library.
    beside = sorted(glob.glob(os.path.join(here, "libconnex.so*")), key=len)
    found += [("next to the package", b) for b in beside[:1]]
    _searched.append("%s/libconnex.so* (%d found)" % (here, len(beside)))
    # Installed by `cmake --install` with the library: _install.LIBDIR is relative to here.
    try:
        from . import _install
        lib = os.path.normpath(os.path.join(here, _install.LIBDIR, "libconnex.so"))
        found.append(("installed with cmake --install", lib))
        _searched.append(lib)
    except ImportError:
        pass
    # python/connex_c -> repository root; build/ and build-*/ there, newest library first.
    root = os.path.dirname(os.path.dirname(here))
    builds = []
    for d in [os.path.join(root, "build")] + glob.glob(os.path.join(root, "build-*")):
        lib = os.path.join(d, "libconnex.so")
        if os.path.exists(lib):
            builds.append((os.path.getmtime(lib), lib))
    builds.sort(reverse=True)
    found += [("build tree", b[1]) for b in builds]
    _searched.append("%s/build*/libconnex.so (%d found)" % (root, len(builds)))
    sys_lib = ctypes.util.find_library("connex")
    if sys_lib:
        found.append(("system linker path", sys_lib))
    else:
        # ldconfig may not list it (LD_LIBRARY_PATH, a fresh install): dlopen searches those.
        found.append(("system linker path", "libconnex.so.0"))
        _searched.append("the system linker path")
    return found, False


_searched = []


def load():
    """Load libconnex and declare its prototypes; LibraryNotFound says where it looked."""
    cands, explicit = _candidates()
    errors = []
    for origin, path in cands:
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            errors.append("%s %s: %s" % (origin, path, exc))
            if explicit:
                break
            continue
        missing = [n for n in _PROTOTYPES if not hasattr(lib, n)]
        if missing:
            errors.append("%s %s: missing symbols %s" % (origin, path, ", ".join(missing)))
            continue
        for name, (res, args) in _PROTOTYPES.items():
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args
        lib.connex_path = path
        return lib
    looked = "; ".join(errors + ([] if explicit else ["looked in " + ", ".join(_searched)]))
    raise LibraryNotFound(
        "connex_c: cannot load libconnex.so (%s). Set CONNEX_LIB to the library file or its "
        "directory, build it (cmake -S . -B build && make -C build connex), or install it "
        "where the system linker finds it." % looked)


_lib = None


def lib():
    """The loaded library, loaded on first use so that `import connex_c` never fails."""
    global _lib
    if _lib is None:
        _lib = load()
    return _lib


def strerror(rc):
    s = lib().cx_strerror(int(rc))
    return s.decode() if s else "error %d" % rc
