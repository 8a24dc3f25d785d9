"""connex_c.Engine: the connex-rs engine surface over libconnex."""

import collections
import concurrent.futures
import ctypes
import ipaddress
import logging
import operator
import re
import threading
import time
import weakref

from . import _args
from ._closable import Closable
from ._lib import (CX_BATCH_MAX, CX_CLASS_BACKGROUND, CX_CLASS_CRITICAL, CX_ECLOSED, CX_EINVAL,
                   CX_ETIMEDOUT, CX_OK, CX_OPK_NAMES, EVENT_NAMES, MEM_KIND_NAMES, cx_batch_entry_t,
                   cx_config_t, cx_dir_entry_t, cx_event_t, cx_msg_t, cx_peer_info_t, cx_stats_t, lib,
                   strerror)

# Blocking waits are cut into slices this long so that close() from another thread is noticed:
# the engine is never destroyed under a thread still inside a C call.
_SLICE_MS = 100

_log = logging.getLogger("connex_c")
_MODEL_RE = re.compile(r"[A-Za-z0-9._:/-]{1,63}")
_PEER_STATES = ("unknown", "connecting", "up", "suspect", "failed", "left")


class Message(collections.namedtuple("Message", "peer data url")):
    """A received message: peer is the sender's LID tuple (model, stage, shard, replica), data
    the bytes, url the sender's full URL (usable as a peer argument). Attributes besides the
    tuple: step, the group step's id (0 for a plain message), and from_incarnation, the
    sender's incarnation: (peer, from_incarnation, step) names a group step uniquely."""
    step = 0
    from_incarnation = 0


class ConnexError(RuntimeError):
    """A libconnex call failed; .code is the CX_* code."""

    def __init__(self, code, what):
        self.code = code
        super().__init__("%s: %s (%d)" % (what, strerror(code), code))


class InvalidArgument(ConnexError, ValueError):
    """libconnex refused an argument (CX_EINVAL); the log line on stderr says which."""


class EngineClosed(ConnexError):
    def __init__(self, what):
        self.code = CX_ECLOSED
        RuntimeError.__init__(self, "%s: the engine is closed" % what)


def _raise(code, what):
    if code == CX_EINVAL:
        raise InvalidArgument(code, what)
    raise ConnexError(code, what)


def _u32(v, what):
    return _args.check_int(v, what, 0, 0xFFFFFFFF)


class PutSignal:
    """The handle of one put_signal. wait() returns the op's status (0 or a negative code)."""

    def __init__(self, engine, op, keep, status=None):
        self._engine = engine
        self._op = op            # c_void_p until cx_op_wait has freed it
        self._keep = keep        # the source buffer stays pinned until completion
        self._status = status
        self._done = threading.Event()
        self._claimed = status is not None
        self._claim_lock = threading.Lock()
        if status is not None:
            self._done.set()

    @property
    def done(self):
        return self._done.is_set()

    def wait(self, timeout_ms=None):
        """The op's status, or CX_ETIMEDOUT (-3) when timeout_ms passed first (wait again)."""
        tmo = _args.timeout(timeout_ms)
        if self._claim():
            if tmo < 0 or tmo >= self._engine._op_bound_ms:
                self._reap()         # the op completes within the op timeout anyway
            else:
                self._engine._reap_async(self)
        if not self._done.wait(None if tmo < 0 else tmo / 1000.0):
            return CX_ETIMEDOUT
        return self._status

    # cx_op_wait frees the op when it returns its status (CX_EINPROGRESS: the wait expired, the
    # op is still valid). Only one thread may call it on an op, so exactly one thread (the
    # claimant, or a pooled reaper thread when the caller's timeout is shorter than the op
    # timeout) makes an unbounded call; a bounded Python wait waits on an Event instead. The op
    # itself is bounded by the engine's op timeout.
    def _claim(self):
        with self._claim_lock:
            if self._claimed:
                return False
            self._claimed = True
            return True

    def _reap(self):
        rc = self._engine._lib.cx_op_wait(self._op, -1)
        self._op = None
        self._keep = None
        self._status = rc
        self._engine._ops.pop(id(self), None)
        self._done.set()


class BatchOp(PutSignal):
    """The handle of a batch put_signal: wait() returns the batch's status (0, or the first
    failed entry's); statuses then holds every entry's, in entry order."""

    def __init__(self, engine, op, keep, st, status=None):
        super().__init__(engine, op, keep, status)
        self._st = st

    @property
    def statuses(self):
        """Every entry's status once done (None before)."""
        return list(self._st) if self._done.is_set() else None


def _ints(seq, what):
    """A list, tuple or numpy array of non-negative ints as Python ints."""
    try:
        vals = [operator.index(v) for v in seq]
    except TypeError:
        raise TypeError("%s must be a sequence of ints (or an integer numpy array)" % what) from None
    for v in vals:
        if v < 0 or v > 0xFFFFFFFFFFFFFFFF:
            raise ValueError("%s: %d is out of range" % (what, v))
    return vals


def _batch_entries(what, peer, local, remote, lengths):
    """The C entry array (and what must outlive it) from parallel sequences. `peer`: one peer
    for every entry (a URL, a LID string or tuple), or a list naming each entry's."""
    loc = _ints(local, what + ": local addresses")
    rem = _ints(remote, what + ": remote addresses")
    lens = _ints(lengths, what + ": lengths")
    n = len(loc)
    if not (n == len(rem) == len(lens)):
        raise ValueError("%s: local addresses, remote addresses and lengths differ in length" % what)
    if not 0 < n <= CX_BATCH_MAX:
        raise ValueError("%s: %d entries (1 to %d)" % (what, n, CX_BATCH_MAX))
    if isinstance(peer, list):
        if len(peer) != n:
            raise ValueError("%s: %d peers for %d entries" % (what, len(peer), n))
        names = [_args.peer(p) for p in peer]
    else:
        names = [_args.peer(peer)] * n
    ents = (cx_batch_entry_t * n)()
    for i in range(n):
        e = ents[i]
        e.peer = names[i]
        e.local = loc[i]
        e.remote = rem[i]
        e.len = lens[i]
    return ents, names, n


class Engine(Closable):
    """One connex engine: a control port, a LID, registered memory, peers.

    Methods that move data return 0 or a negative CX_* code (-2 peer failed, -3 timed out,
    -4 invalid: unregistered or out-of-range memory). Wrong Python types raise TypeError,
    impossible values ValueError; calling a closed engine raises EngineClosed."""

    def __init__(self, model, stage=0, shard=0, replica=0, listen_ip="127.0.0.1", port=0,
                 heartbeat_ms=0, heartbeat_timeout_ms=0, backend=None, op_timeout_ms=0,
                 connect_timeout_ms=0, recv_queue_max=0, recv_queue_bytes=0, auth_token=None,
                 credits_critical=0, credits_background=0, background_chunk=0, classes_off=False,
                 directory=None, peers=None, lease_ms=0, advertise_ip=None):
        if not isinstance(model, str):
            raise TypeError("model must be str, not %s" % type(model).__name__)
        if not _MODEL_RE.fullmatch(model):
            raise ValueError("model %r: want 1-63 characters of [A-Za-z0-9._:/-]" % model)
        cfg = cx_config_t()
        cfg.model = model.encode()
        cfg.stage = _u32(stage, "stage")
        cfg.shard = _u32(shard, "shard")
        cfg.replica = _u32(replica, "replica")
        cfg.listen_ip = _args.text(listen_ip, "listen_ip")
        if listen_ip is not None:
            try:
                ipaddress.ip_address(listen_ip)
            except ValueError:
                raise ValueError("listen_ip %r is not a numeric IPv4/IPv6 address"
                                 % listen_ip) from None
        # None: CONNEX_ADVERTISE_IP, else listen_ip, else (0.0.0.0, ::) the default-route address
        cfg.advertise_ip = _args.text(advertise_ip, "advertise_ip")
        if advertise_ip is not None:
            try:
                ipaddress.ip_address(advertise_ip)
            except ValueError:
                raise ValueError("advertise_ip %r is not a numeric IPv4/IPv6 address"
                                 % advertise_ip) from None
        cfg.port = _args.check_int(port, "port", 0, 65535)
        cfg.backend = _args.text(backend, "backend")
        cfg.heartbeat_ms = _u32(heartbeat_ms, "heartbeat_ms")
        cfg.heartbeat_timeout_ms = _u32(heartbeat_timeout_ms, "heartbeat_timeout_ms")
        cfg.op_timeout_ms = _u32(op_timeout_ms, "op_timeout_ms")
        cfg.connect_timeout_ms = _u32(connect_timeout_ms, "connect_timeout_ms")
        cfg.recv_queue_max = _u32(recv_queue_max, "recv_queue_max")
        cfg.recv_queue_bytes = _args.check_int(recv_queue_bytes, "recv_queue_bytes")
        cfg.auth_token = _args.text(auth_token, "auth_token")   # None: CONNEX_AUTH_TOKEN(_FILE)
        cfg.credits_critical = _u32(credits_critical, "credits_critical")
        cfg.credits_background = _u32(credits_background, "credits_background")
        cfg.background_chunk = _u32(background_chunk, "background_chunk")
        if not isinstance(classes_off, (bool, int)):
            raise TypeError("classes_off must be bool, not %s" % type(classes_off).__name__)
        cfg.classes_off = 1 if classes_off else 0
        # mobility (docs/mobility.md): None -> CONNEX_DIRECTORY / CONNEX_PEERS, else "static"
        cfg.directory = _args.text(directory, "directory")      # "static" or "etcd://ip:port"
        if isinstance(peers, (list, tuple)):
            peers = ",".join(peers)
        cfg.peers = _args.text(peers, "peers")                  # static directory: URLs
        cfg.lease_ms = _u32(lease_ms, "lease_ms")
        self._lib = lib()
        self._e = None
        self._cond = threading.Condition()
        self._active = 0
        self._closing = False
        self._regions = {}     # address -> what pins it (bytearray export, tensor)
        self._ops = {}         # id(handle) -> handle, waited for in close()
        self._reaper = None    # thread pool for PutSignal waits shorter than the op timeout
        self._groups = weakref.WeakSet()   # open Groups, closed before the engine is destroyed
        self._op_bound_ms = (op_timeout_ms or 30000) + 1000
        out = ctypes.c_void_p()
        rc = self._lib.cx_engine_create(ctypes.byref(cfg), ctypes.byref(out))
        if rc != CX_OK:
            _raise(rc, "cx_engine_create(%s|%d|%d|%d on %s:%d)"
                   % (model, stage, shard, replica, listen_ip or "127.0.0.1", port))
        self._e = out

    # ---- lifetime ----

    def _enter(self, what):
        with self._cond:
            if self._closing or self._e is None:
                raise EngineClosed(what)
            self._active += 1
            return self._e

    def _leave(self):
        with self._cond:
            self._active -= 1
            if self._active == 0:
                self._cond.notify_all()

    def close(self):
        """Wait for calls in other threads to return (blocking waits notice within 100 ms),
        complete every put_signal not yet waited for, then BYE to peers and free everything."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            while self._active:
                self._cond.wait()
            e, self._e = self._e, None
        if e is None:
            return
        for g in list(self._groups):   # the C groups go before their engine (group.py)
            g._shutdown()
        # Destroy first: it completes every op still in flight (CX_ECLOSED) after closing the
        # data connections, so the handles below are reaped at once and no byte moves later.
        self._lib.cx_engine_destroy(e)
        pending = list(self._ops.values())
        for h in pending:
            if h._claim():
                self._reap_async(h)
        for h in pending:
            if not h._done.wait(10.0):
                _log.error("connex_c: a put_signal op did not complete after cx_engine_destroy")
        if self._reaper is not None:
            self._reaper.shutdown(wait=False)
        self._regions.clear()

    @property
    def closed(self):
        return self._e is None

    def __repr__(self):
        return "<connex_c.Engine %s>" % (self.local_url if self._e else "closed")

    # ---- identity ----

    def _str_call(self, fn, *args):
        e = self._enter(fn.__name__)
        try:
            s = fn(e, *args)
        finally:
            self._leave()
        return s.decode() if s else None

    @property
    def local_url(self):
        return self._str_call(self._lib.cx_engine_local_url)

    @property
    def backends(self):
        return self._str_call(self._lib.cx_engine_backends)

    @property
    def incarnation(self):
        e = self._enter("incarnation")
        try:
            return self._lib.cx_engine_incarnation(e)
        finally:
            self._leave()

    @property
    def port(self):
        return int(self.local_url.split("#", 1)[0].rsplit(":", 1)[1])

    # ---- peers ----

    def connect(self, peer_url, timeout_ms=5000):
        p = _args.peer(peer_url)
        tmo = _args.timeout(timeout_ms)
        e = self._enter("connect")
        try:
            return self._lib.cx_connect(e, p, tmo)
        finally:
            self._leave()

    def peer_backend(self, peer):
        return self._str_call(self._lib.cx_peer_backend, _args.peer(peer))

    def peer_state(self, peer):
        p = _args.peer(peer)
        e = self._enter("peer_state")
        try:
            st = self._lib.cx_peer_state(e, p)
        finally:
            self._leave()
        return _PEER_STATES[st] if 0 <= st < len(_PEER_STATES) else "unknown"

    def peers(self):
        """Every peer this engine knows: a list of dicts with lid (model, stage, shard, replica),
        url, state, backend (while up), why (the selection's reason), incarnation,
        ops_in_flight, same_host, death_watch (a same-host death watch follows its process) and
        transport (what the data endpoint really runs over, as the backend's library reports it)."""
        n = 16
        while True:
            arr = (cx_peer_info_t * n)()
            e = self._enter("peers")
            try:
                rc = self._lib.cx_peer_list(e, arr, n)
            finally:
                self._leave()
            if rc < 0:
                _raise(rc, "peers")
            if rc <= n:
                break
            n = rc + 16   # more peers appeared: ask again with room for them
        out = []
        for i in arr[:rc]:
            out.append({"lid": i.lid.as_tuple(), "url": i.url.decode(),
                        "state": _PEER_STATES[i.state] if 0 <= i.state < len(_PEER_STATES) else "unknown",
                        "backend": i.backend.decode() or None, "why": i.why.decode(),
                        "incarnation": i.incarnation, "ops_in_flight": i.ops_in_flight,
                        "same_host": bool(i.same_host), "death_watch": bool(i.death_watch),
                        "transport": i.transport.decode()})
        return out

    # ---- memory ----

    def register_memory(self, ptr, n=None):
        """Register [ptr, ptr+n) (n defaults to the size of a buffer or tensor). A bytearray
        stays pinned (cannot be resized) until unregister_memory or close. Device memory (a
        DLPack or __cuda_array_interface__ object on a CUDA device, or a raw device address) is
        registered as device memory: libconnex tells the kind from the address, and an object
        that says it is on a device where libconnex sees host memory is refused (ValueError)."""
        p = _args.pointer(ptr, writable=True, what="register_memory buffer")
        n = p.length(n, "register_memory")
        if p.is_device:
            kind = self.memory_kind(p.address, n)
            if kind == "host":
                raise ValueError(
                    "register_memory: the object says it lives on %s:%d but libconnex sees host "
                    "memory at 0x%x: CUDA is not usable in this process (CONNEX_LIBCUDA, "
                    "docs/gpu.md)" % (p.device[0], p.device[1], p.address))
        e = self._enter("register_memory")
        try:
            rc = self._lib.cx_register_memory(e, p.address, n)
        finally:
            self._leave()
        if rc == CX_OK:
            self._regions[p.address] = p.keep
        return rc

    def unregister_memory(self, ptr):
        p = _args.pointer(ptr, writable=False, what="unregister_memory buffer")
        e = self._enter("unregister_memory")
        try:
            rc = self._lib.cx_unregister_memory(e, p.address)
        finally:
            self._leave()
        if rc == CX_OK:
            self._regions.pop(p.address, None)
        return rc

    def memory_kind(self, ptr, n=None):
        """"host", "cuda" or "sim" (the simulated device): what libconnex sees at [ptr, ptr+n)
        (n defaults to the object's size, 1 for a raw address)."""
        p = _args.pointer(ptr, writable=False, what="memory_kind buffer")
        n = p.length(n, "memory_kind") if (n is not None or p.size is not None) else 1
        kind = self._lib.cx_mem_kind(p.address, n)
        if kind < 0:
            _raise(kind, "memory_kind(0x%x, %d)" % (p.address, n))
        return MEM_KIND_NAMES[kind] if kind < len(MEM_KIND_NAMES) else "unknown"

    def peer_first_region(self, peer):
        """(address, length) of the first region the peer registered, as its HELLO and region
        announcements said; (0, 0) when it registered none. Raises ConnexError (CX_EPEER) when
        the peer is unknown or not up."""
        pe = _args.peer(peer)
        addr, ln = ctypes.c_uint64(), ctypes.c_uint64()
        e = self._enter("peer_first_region")
        try:
            rc = self._lib.cx_peer_first_region(e, pe, ctypes.byref(addr), ctypes.byref(ln))
        finally:
            self._leave()
        if rc != CX_OK:
            _raise(rc, "peer_first_region(%s)" % pe.decode())
        return addr.value, ln.value

    # ---- one-sided ----

    def transfer_sync_read(self, peer, dst, src, n=None):
        """Read n bytes (default: the size of dst) at the peer's address src into the local
        buffer dst."""
        pe = _args.peer(peer)
        p = _args.pointer(dst, writable=True, what="destination")
        _args.remote_addr(src)
        n = p.length(n, "transfer_sync_read")
        e = self._enter("transfer_sync_read")
        try:
            return self._lib.cx_read(e, pe, p.address, src, n)
        finally:
            self._leave()

    def transfer_sync_write(self, peer, src, dst, n=None):
        """Write n bytes (default: the size of src) of the local buffer src to the peer's
        address dst."""
        pe = _args.peer(peer)
        p = _args.pointer(src, writable=False, what="source")
        _args.remote_addr(dst)
        n = p.length(n, "transfer_sync_write")
        e = self._enter("transfer_sync_write")
        try:
            return self._lib.cx_write(e, pe, p.address, dst, n)
        finally:
            self._leave()

    def put_signal(self, peer, src, dst, n, msg):
        """Write n bytes from src to the peer's dst, then deliver msg, which the peer's
        recv_msg returns only once the bytes are in place. Returns a PutSignal handle; a
        submission error gives a handle that is already done with that status."""
        pe = _args.peer(peer)
        p = _args.pointer(src, writable=False, what="source")
        _args.remote_addr(dst)
        n = p.length(n, "put_signal")     # None: the size of src
        m = _args.message(msg)
        op = ctypes.c_void_p()
        e = self._enter("put_signal")
        try:
            rc = self._lib.cx_put_signal(e, pe, p.address, dst, n, m, len(m), ctypes.byref(op))
        finally:
            self._leave()
        if rc != CX_OK:
            return PutSignal(self, None, None, status=rc)
        h = PutSignal(self, op, (p, m))
        self._ops[id(h)] = h
        return h

    # ---- batches (docs/api.md) ----

    def _batch(self, what, fn, peer, local, remote, lengths):
        ents, _names, n = _batch_entries(what, peer, local, remote, lengths)
        st = (ctypes.c_int * n)()
        e = self._enter(what)
        try:
            fn(e, ents, n, st)
        finally:
            self._leave()
        return list(st)

    def transfer_batch_read(self, peer, dsts, srcs, lengths):
        """One batch: entry i reads lengths[i] bytes at the peer's srcs[i] into the local address
        dsts[i] (registered memory). Lists or integer numpy arrays; `peer` is one peer or a list
        of one per entry. Returns every entry's status (0 or a negative CX_* code), in order; a
        bad entry refuses the whole batch (every status CX_EINVAL, the log names the entry)."""
        return self._batch("transfer_batch_read", self._lib.cx_batch_read, peer, dsts, srcs, lengths)

    def transfer_batch_write(self, peer, srcs, dsts, lengths):
        """One batch: entry i writes lengths[i] bytes at the local address srcs[i] to the peer's
        dsts[i]. Returns every entry's status, as transfer_batch_read."""
        return self._batch("transfer_batch_write", self._lib.cx_batch_write, peer, srcs, dsts, lengths)

    def batch_put_signal(self, peer, srcs, dsts, lengths, msg, cls=CX_CLASS_CRITICAL):
        """Write every entry to the peer, then deliver msg, which the peer's recv_msg returns
        only once every entry is in place. Returns a BatchOp: wait() gives the batch's status,
        .statuses then every entry's."""
        pe = _args.peer(peer)
        ents, names, n = _batch_entries("batch_put_signal", peer, srcs, dsts, lengths)
        m = _args.message(msg)
        if cls not in (CX_CLASS_CRITICAL, CX_CLASS_BACKGROUND) or isinstance(cls, bool):
            raise ValueError("batch_put_signal: cls must be CX_CLASS_CRITICAL (0) or CX_CLASS_BACKGROUND (1)")
        st = (ctypes.c_int * n)()
        op = ctypes.c_void_p()
        e = self._enter("batch_put_signal")
        try:
            rc = self._lib.cx_batch_put_signal(e, pe, ents, n, m, len(m), cls, st, ctypes.byref(op))
        finally:
            self._leave()
        if rc != CX_OK:
            return BatchOp(self, None, None, st, status=rc)
        h = BatchOp(self, op, (ents, names, m, st), st)
        self._ops[id(h)] = h
        return h

    # ---- traffic classes (docs/semantics.md) ----

    def _class_op(self, what, fn, peer, local, writable, remote, n, cls):
        pe = _args.peer(peer)
        p = _args.pointer(local, writable=writable, what="destination" if writable else "source")
        _args.remote_addr(remote)
        n = p.length(n, what)
        if isinstance(cls, bool) or not isinstance(cls, int):
            raise TypeError("%s: cls must be int, not %s" % (what, type(cls).__name__))
        if cls not in (CX_CLASS_CRITICAL, CX_CLASS_BACKGROUND):
            raise ValueError("%s: cls %d is neither CX_CLASS_CRITICAL (0) nor CX_CLASS_BACKGROUND (1)"
                             % (what, cls))
        op = ctypes.c_void_p()
        e = self._enter(what)
        try:
            rc = fn(e, pe, p.address, remote, n, cls, ctypes.byref(op))
        finally:
            self._leave()
        if rc != CX_OK:
            return PutSignal(self, None, None, status=rc)
        h = PutSignal(self, op, (p,))
        self._ops[id(h)] = h
        return h

    def read_async(self, peer, dst, src, n=None, cls=CX_CLASS_CRITICAL):
        """Read n bytes at the peer's src into dst in a traffic class (CX_CLASS_CRITICAL or
        CX_CLASS_BACKGROUND: chunked, yields to critical ops). Returns an op handle (wait())."""
        return self._class_op("read_async", self._lib.cx_read_async, peer, dst, True, src, n, cls)

    def write_async(self, peer, src, dst, n=None, cls=CX_CLASS_CRITICAL):
        """Write n bytes of src to the peer's dst in a traffic class; returns an op handle."""
        return self._class_op("write_async", self._lib.cx_write_async, peer, src, False, dst, n, cls)

    def _reap_async(self, h):
        with self._cond:
            if self._reaper is None:
                self._reaper = concurrent.futures.ThreadPoolExecutor(
                    max_workers=256, thread_name_prefix="connex-op-wait")
            pool = self._reaper
        pool.submit(h._reap)

    # ---- messages ----

    def send_msg(self, peer, data):
        pe = _args.peer(peer)
        m = _args.message(data)
        e = self._enter("send_msg")
        try:
            return self._lib.cx_send_msg(e, pe, m, len(m))
        finally:
            self._leave()

    def _sliced(self, what, timeout_ms, call):
        """Run call(e, slice_ms) until it returns something other than CX_ETIMEDOUT or the
        timeout passes; the GIL is free during each call (ctypes.CDLL)."""
        tmo = _args.timeout(timeout_ms)
        deadline = None if tmo < 0 else time.monotonic() + tmo / 1000.0
        while True:
            left = _SLICE_MS if deadline is None else \
                int(max(0.0, deadline - time.monotonic()) * 1000)
            e = self._enter(what)
            try:
                rc = call(e, min(left, _SLICE_MS))
            finally:
                self._leave()
            if rc != CX_ETIMEDOUT:
                return rc
            if deadline is not None and time.monotonic() >= deadline:
                return rc

    def recv_msg(self, timeout_ms=None):
        """The next message as Message(peer, data, url), or None when none came in time."""
        m = cx_msg_t()
        rc = self._sliced("recv_msg", timeout_ms,
                          lambda e, t: self._lib.cx_recv_msg(e, ctypes.byref(m), t))
        if rc == CX_ETIMEDOUT:
            return None
        if rc != CX_OK:
            _raise(rc, "recv_msg")
        try:
            data = ctypes.string_at(m.data, m.len) if m.len else b""
            msg = Message(m.from_.as_tuple(), data, m.from_url.decode())
            msg.step = m.step
            msg.from_incarnation = m.from_incarnation
            return msg
        finally:
            self._lib.cx_msg_release(ctypes.byref(m))

    def wait_event(self, timeout_ms=None):
        """The next peer event as a dict, or None when none came in time:
        {"type": "up"|"joined"|"failed"|"suspect"|"left", "peer": (model, stage, shard,
        replica), "reason": str, "url": str, "incarnation": int, "time_ns": int}."""
        ev = cx_event_t()
        rc = self._sliced("wait_event", timeout_ms,
                          lambda e, t: self._lib.cx_wait_event(e, ctypes.byref(ev), t))
        if rc == CX_ETIMEDOUT:
            return None
        if rc != CX_OK:
            _raise(rc, "wait_event")
        t = ev.type
        return {"type": EVENT_NAMES[t] if 0 <= t < len(EVENT_NAMES) else "unknown(%d)" % t,
                "peer": ev.peer.as_tuple(),
                "reason": ev.reason.decode("utf-8", "replace"),
                "url": ev.url.decode("utf-8", "replace"),
                "incarnation": ev.incarnation,
                "time_ns": ev.time_ns}

    # ---- counters ----

    def stats(self):
        st = cx_stats_t()
        e = self._enter("stats")
        try:
            rc = self._lib.cx_stats(e, ctypes.byref(st))
        finally:
            self._leave()
        if rc != CX_OK:
            _raise(rc, "stats")
        out = {}
        for name, ctype in cx_stats_t._fields_:
            v = getattr(st, name)
            if hasattr(ctype, "_length_"):
                v = dict(zip(CX_OPK_NAMES, list(v)))
            out[name] = v
        return out

    def metrics(self):
        """The engine's metrics as Prometheus text (cx_stats_format; docs/operations.md)."""
        size = 65536
        for _ in range(8):   # the text may grow between two calls: a few tries, each larger
            buf = ctypes.create_string_buffer(size)
            e = self._enter("metrics")
            try:
                n = self._lib.cx_stats_format(e, buf, size)
            finally:
                self._leave()
            if n < 0:
                _raise(n, "metrics")
            if n < size:
                return buf.raw[:n].decode("utf-8", "replace")
            size = n + 65536
        from ._lib import CX_ENOMEM
        _raise(CX_ENOMEM, "metrics")

    # ---- mobility (docs/mobility.md): directory and replica groups ----

    def group(self, pattern, policy="round_robin"):
        """Open a replica group over the members matching pattern ("model|stage|*|*"); policy
        "round_robin" or "least_inflight". Returns a connex_c.Group (see group.py)."""
        from .group import Group
        return Group(self, pattern, policy)

    def directory(self, pattern=None):
        """Directory entries whose LID matches pattern (None: all), this engine's own included:
        a list of {"lid": (model, stage, shard, replica), "url": str, "version": int}."""
        pat = None if pattern is None else _args.pattern(pattern)
        n = 16
        while True:
            arr = (cx_dir_entry_t * n)()
            e = self._enter("directory")
            try:
                rc = self._lib.cx_directory_list(e, pat, arr, n)
            finally:
                self._leave()
            if rc < 0:
                _raise(rc, "directory(%r)" % (pattern,))
            if rc <= n:
                break
            n = rc + 16   # entries appeared meanwhile: ask again with room for them
        return [{"lid": d.lid.as_tuple(), "url": d.url.decode("utf-8", "replace"),
                 "version": d.version} for d in arr[:rc]]

    @property
    def directory_kind(self):
        """"static" or "etcd"."""
        return self._str_call(self._lib.cx_directory_kind)
