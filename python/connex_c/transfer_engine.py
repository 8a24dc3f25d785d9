"""connex_c.TransferEngine: Mooncake Transfer Engine's Python surface over a connex Engine.
Same return conventions: 0 or a negative code, addresses as ints; allocate_managed_buffer,
get_first_buffer_address and batch_transfer_async_* return 0 on failure. Buffers may also be
tensors (DLPack, __cuda_array_interface__) and buffer-protocol objects, as for Engine.
`connex_c.mooncake` maps Mooncake's module names to this one (docs/python.md).

Naming, since connex names peers by a logical identity (LID) and Mooncake by "ip:port":
- initialize(local_hostname, ...) takes "ip:port", "ip" or "ip:0" (a free port is picked), a full
  connex URL "ip:port#model|stage|shard|replica". Without a URL the LID is the address's own
  default LID ("te-<ip>", 0, 0, <port>), so a peer addressed as "ip:port" is found without any
  metadata service, and a process restarted on the same ip:port is the same peer (it rejoins).
- metadata_server: "P2PHANDSHAKE", "" or None (no metadata service, as above), or a bare LID
  "model|stage|shard|replica" naming this engine. etcd/http/redis metadata services are not
  supported: initialize returns CX_EUNSUPPORTED and logs why.
- target_hostname: "ip:port" (a peer that uses the default LID), a full URL, or a bare LID the
  engine already knows.
- protocol: "rdma" or "auto" = every usable backend, best per peer; "tcp" = zmq; "efa" =
  libfabric; "ucx", "libfabric", "zmq" as such. device_name is not used: select/ picks devices
  (UCX_NET_DEVICES and FI_PROVIDER still apply).
"""

import ctypes
import enum
import ipaddress
import json
import logging
import os
import socket
import threading

from . import _args
from ._lib import (CX_EINVAL, CX_ENOMEM, CX_EPEER, CX_ETIMEDOUT, CX_EUNSUPPORTED, CX_MEM_CUDA,
                   CX_MEM_SIM, CX_OK, MEM_KIND_NAMES, lib, strerror)
from ._pool import ManagedPool, _DeviceArena
from .engine import ConnexError, Engine

_log = logging.getLogger("connex_c")

_PROTOCOLS = {"rdma": "auto", "auto": "auto", "": "auto", "tcp": "zmq", "efa": "libfabric",
              "ucx": "ucx", "libfabric": "libfabric", "zmq": "zmq"}
_NO_METADATA = ("", "P2PHANDSHAKE")
DEFAULT_POOL_BYTES = int(os.environ.get("CONNEX_TE_POOL_BYTES", 64 << 20))


def default_lid(ip, port):
    """The LID an engine initialized with a plain "ip:port" has."""
    return ("te-" + ip, 0, 0, port)


def _numeric(host):
    """A numeric address for host (names resolved here once; the core wants numbers)."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError("cannot resolve host %r: %s" % (host, exc)) from None
    infos.sort(key=lambda i: i[0] != socket.AF_INET)   # IPv4 first
    return infos[0][4][0]


def split_hostport(s, need_port):
    """"ip:port", "[v6]:port", "ip" -> (numeric ip, port or None)."""
    if s.startswith("["):
        host, sep, rest = s[1:].partition("]")
        if not sep:
            raise ValueError("unterminated '[' in %r" % s)
        port = rest[1:] if rest.startswith(":") else None
        if rest and not rest.startswith(":"):
            raise ValueError("junk after ']' in %r" % s)
    elif s.count(":") == 1:
        host, port = s.split(":")
    else:
        host, port = s, None            # a bare IPv4/IPv6 address or name
    if port is not None:
        if not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError("bad port in %r" % s)
        port = int(port)
        if port == 0 and need_port:
            raise ValueError("%r: port 0 cannot name a peer" % s)
    elif need_port:
        raise ValueError("%r has no port; want ip:port" % s)
    if not host:
        raise ValueError("no host in %r" % s)
    return _numeric(host), port


def _url(ip, port, lid):
    host = "[%s]" % ip if ":" in ip else ip
    return "%s:%d#%s|%d|%d|%d" % (host, port, lid[0], lid[1], lid[2], lid[3])


def _free_port(ip):
    fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return s.getsockname()[1]


class TransferOpcode(enum.IntEnum):
    """Mooncake's opcode for transfer_sync, batch_transfer_sync and batch_transfer_async."""
    READ = 0
    WRITE = 1
    Read = 0          # the spelling of Mooncake's C++ enum
    Write = 1


class TransferNotify:
    """A notification delivered after a transfer_sync / batch_transfer_sync: the peer's
    get_notifies() returns it. It travels as a connex message, after the data (put_signal)."""

    __slots__ = ("name", "msg")

    def __init__(self, name="", msg=""):
        self.name = name
        self.msg = msg

    def __repr__(self):
        return "TransferNotify(%r, %r)" % (self.name, self.msg)

    def _encode(self):
        return _NOTIFY_TAG + json.dumps([self.name, self.msg]).encode()

    @staticmethod
    def _decode(data):
        if not data.startswith(_NOTIFY_TAG):
            return None
        try:
            name, msg = json.loads(data[len(_NOTIFY_TAG):].decode())
        except (ValueError, UnicodeDecodeError):
            return None
        return TransferNotify(name, msg)


_NOTIFY_TAG = b"\x00mc-notify\x00"
# transfer_check_status, as Mooncake reports it
_ST_DONE, _ST_PENDING, _ST_FAILED, _ST_TIMEOUT = 1, 0, -1, -2


def _buffer_device(spec):
    """"cpu" -> None; "sim" -> (CX_MEM_SIM, 0); "cuda" / "cuda:N" -> (CX_MEM_CUDA, N)."""
    if spec in (None, "cpu", "host"):
        return None
    if not isinstance(spec, str):
        raise TypeError("buffer_device must be str like 'cuda:0', not %s" % type(spec).__name__)
    if spec == "sim":
        return (CX_MEM_SIM, 0)
    name, _, idx = spec.partition(":")
    if name == "cuda" and (idx == "" or idx.isdigit()):
        return (CX_MEM_CUDA, int(idx or 0))
    raise ValueError("buffer_device %r: want 'cpu', 'cuda', 'cuda:N' or 'sim'" % spec)


class TransferEngine:
    """Mooncake-style transfer engine. Create, then initialize(); methods mirror Mooncake's
    (docs/python.md, "TransferEngine"): 0 or a negative code; allocate_managed_buffer,
    get_first_buffer_address and batch_transfer_async_* return 0 for a failure."""

    def __init__(self, buffer_device="cpu", pool_bytes=None, **engine_kwargs):
        """buffer_device: where managed buffers live: "cpu", "cuda", "cuda:N" or "sim" (the
        simulated device). pool_bytes: the size of each registered arena behind
        allocate_managed_buffer (default CONNEX_TE_POOL_BYTES, 64 MiB). engine_kwargs go to
        connex_c.Engine (heartbeat_ms, op_timeout_ms, connect_timeout_ms, ...)."""
        self._device = _buffer_device(buffer_device)
        if pool_bytes is None:
            pool_bytes = DEFAULT_POOL_BYTES
        self._pool_bytes = _args.length(pool_bytes, "pool_bytes")
        self._kw = engine_kwargs
        self._connect_ms = engine_kwargs.get("connect_timeout_ms") or 5000
        self.engine = None
        self._pool = None
        self._regions = {}                # user-registered: address -> length
        self._batches = {}                # batch id -> [op handles]
        self._next_batch = 1
        self._block = threading.Lock()
        self._notifies = []

    # ---- setup ----

    def initialize(self, local_hostname, metadata_server="P2PHANDSHAKE", protocol="rdma",
                   device_name=""):
        """0, or a negative code (logged). Malformed arguments raise TypeError/ValueError."""
        _args.text(local_hostname, "local_hostname", allow_none=False)
        _args.text(device_name, "device_name")
        _args.text(protocol, "protocol")
        _args.text(metadata_server, "metadata_server")
        if self.engine is not None:
            raise RuntimeError("TransferEngine.initialize called twice")
        backend = _PROTOCOLS.get((protocol or "").lower())
        if backend is None:
            raise ValueError("protocol %r: want one of %s" % (protocol, ", ".join(sorted(
                p for p in _PROTOCOLS if p))))
        lid = None
        if "#" in local_hostname:
            addr, lid_s = local_hostname.split("#", 1)
            lid = self._parse_lid(lid_s)
        else:
            addr = local_hostname
        ip, port = split_hostport(addr, need_port=False)
        meta = metadata_server or ""
        if meta not in _NO_METADATA:
            if "|" in meta and "://" not in meta:
                if lid is not None:
                    raise ValueError("LID given twice (local_hostname URL and metadata_server)")
                lid = self._parse_lid(meta)
            else:
                _log.error("connex_c: metadata server %r is not supported; use P2PHANDSHAKE "
                           "and address peers as ip:port or by URL", meta)
                return CX_EUNSUPPORTED
        kw = dict(self._kw, listen_ip=ip, backend=backend)
        tries = 1 if (port or lid is not None) else 5
        last = None
        for _ in range(tries):
            p = port if (port or lid is not None) else _free_port(ip)
            the_lid = lid or default_lid(ip, p)
            try:
                self.engine = Engine(the_lid[0], the_lid[1], the_lid[2], the_lid[3], port=p or 0,
                                     **kw)
                break
            except ConnexError as exc:
                last = exc          # the free port may have been taken meanwhile: try another
        if self.engine is None:
            _log.error("connex_c: TransferEngine.initialize(%r): %s", local_hostname, last)
            return last.code
        new_arena = None
        if self._device is not None:
            kind, dev = self._device
            new_arena = lambda size: _DeviceArena(size, lib(), kind, dev)   # noqa: E731
        self._pool = ManagedPool(self.engine.register_memory, self.engine.unregister_memory,
                                 self._pool_bytes, new_arena)
        # Like Mooncake, the managed buffers' memory is registered at start: it is this
        # engine's first buffer, the one get_first_buffer_address gives peers.
        if not self._pool.reserve():
            _log.error("connex_c: TransferEngine.initialize: the managed buffer pool (%d bytes "
                       "of %s memory) could not be allocated and registered", self._pool_bytes,
                       "host" if self._device is None else MEM_KIND_NAMES[self._device[0]])
            self.engine.close()
            self.engine = None
            return CX_ENOMEM
        return CX_OK

    def initialize_ext(self, local_hostname, metadata_server, protocol, device_name,
                       metadata_type="p2p"):
        """initialize(); metadata_type "p2p" (or "" / None) only: there is no metadata service."""
        _args.text(metadata_type, "metadata_type")
        if (metadata_type or "p2p").lower() not in ("p2p", "p2phandshake"):
            _log.error("connex_c: metadata type %r is not supported (p2p only)", metadata_type)
            return CX_EUNSUPPORTED
        return self.initialize(local_hostname, metadata_server, protocol, device_name)

    @staticmethod
    def _parse_lid(s):
        parts = s.split("|")
        if len(parts) != 4 or not all(x.isdigit() for x in parts[1:]):
            raise ValueError("LID %r: want model|stage|shard|replica" % s)
        return (parts[0], int(parts[1]), int(parts[2]), int(parts[3]))

    def _e(self):
        if self.engine is None:
            raise RuntimeError("TransferEngine: call initialize() first")
        return self.engine

    def get_engine(self):
        """The connex_c.Engine underneath (Mooncake: the inner engine)."""
        return self._e()

    def get_rpc_port(self):
        return self._e().port

    def get_local_url(self):
        """This engine's full URL (what a peer with a non-default LID needs)."""
        return self._e().local_url

    def get_session_id(self):
        url = self._e().local_url
        return url.split("#", 1)[0]

    def get_local_topology(self, device_name=None):
        """JSON: this engine's backends (best first), its URL, where managed buffers live, and
        the peers it knows with the backend each pair uses. (Mooncake lists NICs per device
        here; connex picks devices itself: connex-probe shows its view of the host.)"""
        _args.text(device_name, "device_name")
        e = self._e()
        return json.dumps({
            "url": e.local_url, "backends": (e.backends or "").split(","),
            "buffer_device": "cpu" if self._device is None else
            "%s:%d" % (MEM_KIND_NAMES[self._device[0]], self._device[1]),
            "peers": {p["url"]: p["backend"] for p in e.peers()}})

    def target(self, target_hostname):
        """The connex peer name for a Mooncake target name."""
        _args.text(target_hostname, "target_hostname", allow_none=False)
        if "#" in target_hostname or "|" in target_hostname:
            return target_hostname
        ip, port = split_hostport(target_hostname, need_port=True)
        return _url(ip, port, default_lid(ip, port))

    def _target_or_none(self, target_hostname, what):
        """target() that logs and gives None for a name that cannot be a peer."""
        try:
            return self.target(target_hostname)
        except ValueError as exc:
            _log.error("connex_c: %s(%r): %s", what, target_hostname, exc)
            return None

    def send_probe(self, peer_server_name):
        """0 when the peer answers (it is connected, or a connect within connect_timeout_ms
        succeeds), else a negative code: CX_EPEER for an unknown or unreachable peer."""
        t = self._target_or_none(peer_server_name, "send_probe")
        if t is None:
            return CX_EINVAL
        e = self._e()
        if e.peer_state(t) == "up":
            return CX_OK
        return e.connect(t, self._connect_ms)

    def get_first_buffer_address(self, segment_name):
        """The address of the first buffer the peer registered (its managed buffer pool, or the
        first memory it registered itself), learned from the peer over the control connection;
        0 when the peer is unknown, unreachable or has registered nothing."""
        t = self._target_or_none(segment_name, "get_first_buffer_address")
        if t is None:
            return 0
        if self.send_probe(segment_name) != CX_OK:
            _log.error("connex_c: get_first_buffer_address(%r): the peer is unreachable",
                       segment_name)
            return 0
        try:
            addr, _ = self._e().peer_first_region(t)
        except ConnexError as exc:
            _log.error("connex_c: get_first_buffer_address(%r): %s", segment_name, exc)
            return 0
        return addr

    # ---- memory ----

    def register_memory(self, buffer_addr, capacity=None):
        p = _args.pointer(buffer_addr, writable=True, what="buffer_addr")
        capacity = p.length(capacity, "register_memory")
        rc = self._e().register_memory(buffer_addr, capacity)
        if rc == CX_OK:
            self._regions[p.address] = capacity
        return rc

    def unregister_memory(self, buffer_addr):
        p = _args.pointer(buffer_addr, writable=False, what="buffer_addr")
        rc = self._e().unregister_memory(buffer_addr)
        if rc == CX_OK:
            self._regions.pop(p.address, None)
        return rc

    def batch_register_memory(self, buffer_addresses, capacities):
        """Register each; on the first failure, those registered by this call are unregistered
        again and the failure's code is returned."""
        if len(buffer_addresses) != len(capacities):
            raise ValueError("batch_register_memory: %d addresses, %d capacities"
                             % (len(buffer_addresses), len(capacities)))
        done = []
        for a, n in zip(buffer_addresses, capacities):
            rc = self.register_memory(a, n)
            if rc != CX_OK:
                for d in done:
                    self.unregister_memory(d)
                return rc
            done.append(a)
        return CX_OK

    def batch_unregister_memory(self, buffer_addresses):
        """Unregister each; the first failure's code (the others are still unregistered)."""
        first = CX_OK
        for a in buffer_addresses:
            rc = self.unregister_memory(a)
            if rc != CX_OK and first == CX_OK:
                first = rc
        return first

    def allocate_managed_buffer(self, length):
        """The address of `length` bytes of registered memory (from the pool, on the
        buffer_device), or 0."""
        _args.length(length)
        self._e()
        return self._pool.allocate(length)

    def free_managed_buffer(self, buffer_addr, length):
        _args.check_int(buffer_addr, "buffer_addr")
        _args.length(length)
        self._e()
        if not self._pool.free(buffer_addr, length):
            _log.error("connex_c: free_managed_buffer(0x%x, %d): not a managed buffer of that "
                       "length", buffer_addr, length)
            return CX_EINVAL
        return CX_OK

    def _check_local(self, addr, length, what):
        _args.check_int(addr, what)
        _args.length(length)
        if self._pool is not None and self._pool.contains(addr, length):
            return
        for base, n in self._regions.items():
            if base <= addr and addr + length <= base + n:
                return
        raise ValueError("%s: [0x%x, +%d) is not inside a managed buffer or memory registered "
                         "with this TransferEngine" % (what, addr, length))

    def write_bytes_to_buffer(self, dest_address, src, length):
        """Copy length bytes of src (bytes-like) to dest_address (host or device memory); 0."""
        data = _args.message(src) if not isinstance(src, (bytes, bytearray)) else src
        _args.length(length)
        if length > len(data):
            raise ValueError("write_bytes_to_buffer: length %d > %d bytes given"
                             % (length, len(data)))
        self._check_local(dest_address, length, "write_bytes_to_buffer")
        rc = lib().cx_mem_copy(dest_address, bytes(data[:length]), length)
        return rc

    def read_bytes_from_buffer(self, source_address, length):
        self._check_local(source_address, length, "read_bytes_from_buffer")
        out = ctypes.create_string_buffer(length)
        rc = lib().cx_mem_copy(out, source_address, length)
        if rc != CX_OK:
            raise ConnexError(rc, "read_bytes_from_buffer(0x%x, %d)" % (source_address, length))
        return out.raw

    # ---- synchronous transfers ----

    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length=None,
                           transport_hint=""):
        return self._e().transfer_sync_read(self.target(target_hostname), buffer,
                                            peer_buffer_address, length)

    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length=None,
                            transport_hint=""):
        return self._e().transfer_sync_write(self.target(target_hostname), buffer,
                                             peer_buffer_address, length)

    def transfer_sync(self, target_hostname, buffer, peer_buffer_address, length, opcode,
                      notify=None, transport_hint=""):
        """A read or a write (opcode), then notify (a TransferNotify) to the peer's
        get_notifies: after a write it travels as the write's signal, so it arrives after
        the data."""
        op = self._opcode(opcode)
        t = self.target(target_hostname)
        e = self._e()
        if notify is None:
            if op == TransferOpcode.READ:
                return e.transfer_sync_read(t, buffer, peer_buffer_address, length)
            return e.transfer_sync_write(t, buffer, peer_buffer_address, length)
        msg = self._notify_bytes(notify)
        if op == TransferOpcode.WRITE:
            return e.put_signal(t, buffer, peer_buffer_address, length, msg).wait()
        rc = e.transfer_sync_read(t, buffer, peer_buffer_address, length)
        return rc if rc != CX_OK else e.send_msg(t, msg)

    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                                 transport_hint="", statuses=None):
        """One batch (one call into the engine, one completion): 0, or the first failed entry's
        status. A list passed as statuses receives every entry's, in order."""
        return self._batch(TransferOpcode.READ, target_hostname, buffers, peer_buffer_addresses,
                           lengths, statuses)

    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                                  transport_hint="", statuses=None):
        return self._batch(TransferOpcode.WRITE, target_hostname, buffers, peer_buffer_addresses,
                           lengths, statuses)

    def batch_transfer_sync(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                            opcode, notify=None, transport_hint=""):
        op = self._opcode(opcode)
        rc = self._batch(op, target_hostname, buffers, peer_buffer_addresses, lengths)
        if rc != CX_OK or notify is None:
            return rc
        return self._e().send_msg(self.target(target_hostname), self._notify_bytes(notify))

    def _batch(self, op, target, bufs, addrs, lens, statuses=None):
        if not (len(bufs) == len(addrs) == len(lens)):
            raise ValueError("batch: buffers, peer addresses and lengths differ in length")
        if not bufs:
            return CX_OK
        e = self._e()
        fn = e.transfer_batch_read if op == TransferOpcode.READ else e.transfer_batch_write
        st = fn(self.target(target), bufs, addrs, lens)
        if statuses is not None:
            statuses[:] = st
        return next((rc for rc in st if rc != CX_OK), CX_OK)

    @staticmethod
    def _opcode(opcode):
        if isinstance(opcode, bool) or not isinstance(opcode, int) or opcode not in (0, 1):
            raise ValueError("opcode must be TransferOpcode.READ or TransferOpcode.WRITE, not %r"
                             % (opcode,))
        return TransferOpcode(int(opcode))

    @staticmethod
    def _notify_bytes(notify):
        if not isinstance(notify, TransferNotify):
            raise TypeError("notify must be a TransferNotify, not %s" % type(notify).__name__)
        return notify._encode()

    def get_notifies(self):
        """The TransferNotify objects received since the last call (other messages sent to
        this engine are dropped with a log line: this engine's messages are notifications)."""
        e = self._e()
        out = []
        while True:
            m = e.recv_msg(0)
            if m is None:
                return out
            n = TransferNotify._decode(m.data)
            if n is None:
                _log.warning("connex_c: get_notifies: a %d-byte message from %s is not a "
                             "notification (dropped)", len(m.data), m.url)
                continue
            out.append(n)

    # ---- asynchronous transfers: batch ids ----
    #
    # A batch is a list of op handles (Engine.read_async / write_async, one per entry);
    # submission goes through _submit_ops only, so one C batch call can take its place.

    def _submit_ops(self, what, target_hostname, buffers, peer_buffer_addresses, lengths, opcode):
        """A batch id (> 0), or the negative code of the first entry that could not be
        submitted (the entries already submitted complete in the background)."""
        if not (len(buffers) == len(peer_buffer_addresses) == len(lengths)):
            raise ValueError("%s: buffers, peer addresses and lengths differ in length" % what)
        t = self._target_or_none(target_hostname, what)
        if t is None:
            return CX_EINVAL
        e = self._e()
        if "#" not in t and e.peer_state(t) == "unknown":
            # A bare LID this engine never met cannot be reached (Mooncake: no such segment).
            _log.error("connex_c: %s(%r): unknown peer", what, target_hostname)
            return CX_EPEER
        fn = e.read_async if opcode == TransferOpcode.READ else e.write_async
        hs = []
        for b, a, n in zip(buffers, peer_buffer_addresses, lengths):
            h = fn(t, b, a, n)
            rc = h.wait(0) if h.done else CX_OK     # done at once: refused at submission
            if rc != CX_OK:
                _log.error("connex_c: %s(%r): an entry was refused: %s", what, target_hostname,
                           rc)
                for other in hs:
                    other.wait(0)          # reaped in the background; nobody asks for them
                return rc
            hs.append(h)
        with self._block:
            bid = self._next_batch
            self._next_batch += 1
            self._batches[bid] = hs
        return bid

    def batch_transfer_async_read(self, target_hostname, buffers, peer_buffer_addresses,
                                  lengths, transport_hint=""):
        """A batch id for get_batch_transfer_status, or 0 when it could not be submitted."""
        return max(0, self._submit_ops("batch_transfer_async_read", target_hostname, buffers,
                                       peer_buffer_addresses, lengths, TransferOpcode.READ))

    def batch_transfer_async_write(self, target_hostname, buffers, peer_buffer_addresses,
                                   lengths, transport_hint=""):
        return max(0, self._submit_ops("batch_transfer_async_write", target_hostname, buffers,
                                       peer_buffer_addresses, lengths, TransferOpcode.WRITE))

    def batch_transfer_async(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                             opcode, transport_hint=""):
        return max(0, self._submit_ops("batch_transfer_async", target_hostname, buffers,
                                       peer_buffer_addresses, lengths, self._opcode(opcode)))

    def transfer_submit_read(self, target_hostname, buffer, peer_buffer_address, length=None,
                             transport_hint=""):
        """A batch id (> 0) for transfer_check_status, or a negative code."""
        return self._submit_ops("transfer_submit_read", target_hostname, [buffer],
                                [peer_buffer_address], [length], TransferOpcode.READ)

    def transfer_submit_write(self, target_hostname, buffer, peer_buffer_address, length=None,
                              transport_hint=""):
        return self._submit_ops("transfer_submit_write", target_hostname, [buffer],
                                [peer_buffer_address], [length], TransferOpcode.WRITE)

    def _take(self, bid, what):
        _args.check_int(bid, "batch id")
        with self._block:
            hs = self._batches.get(bid)
        if hs is None:
            _log.error("connex_c: %s: unknown batch id %d (never issued, or already reported)",
                       what, bid)
        return hs

    def get_batch_transfer_status(self, batch_ids):
        """Wait for every batch in batch_ids (a list, or one id): 0 when all their transfers
        succeeded, else the negative code of the first that failed (CX_ETIMEDOUT, CX_EPEER,
        ...); CX_EINVAL for an unknown id. The ids are used up."""
        if isinstance(batch_ids, int) and not isinstance(batch_ids, bool):
            batch_ids = [batch_ids]
        first = CX_OK
        for bid in batch_ids:
            hs = self._take(bid, "get_batch_transfer_status")
            if hs is None:
                first = first or CX_EINVAL
                continue
            for h in hs:
                rc = h.wait()
                if rc != CX_OK and first == CX_OK:
                    first = rc
            with self._block:
                self._batches.pop(bid, None)
        return first

    def transfer_check_status(self, batch_id):
        """Without waiting: 1 done, 0 still in flight, -1 failed, -2 timed out (Mooncake's
        values); a finished id is used up. -1 for an unknown id."""
        hs = self._take(batch_id, "transfer_check_status")
        if hs is None:
            return _ST_FAILED
        for h in hs:
            if not h.done:
                h.wait(0)                  # starts the background wait, returns at once
                if not h.done:
                    return _ST_PENDING
        with self._block:
            self._batches.pop(batch_id, None)
        worst = _ST_DONE
        for h in hs:
            rc = h.wait(0)
            if rc == CX_ETIMEDOUT:
                return _ST_TIMEOUT
            if rc != CX_OK:
                worst = _ST_FAILED
        return worst

    # ---- transfers ordered on a CUDA stream ----

    def _on_cuda(self, what, fn, args, stream_ptr):
        """Mooncake enqueues these on the stream; here the caller waits for the stream's work
        so far (cuStreamSynchronize), then transfers synchronously. RuntimeError on failure."""
        _args.check_int(stream_ptr, "stream_ptr")
        if stream_ptr:
            _cuda_stream_sync(stream_ptr, what)
        rc = fn(*args)
        if rc != CX_OK:
            raise RuntimeError("%s: %s (%d)" % (what, strerror(rc), rc))

    def transfer_write_on_cuda(self, target_hostname, buffer, peer_buffer_address, length,
                               stream_ptr=0, transport_hint=""):
        self._on_cuda("transfer_write_on_cuda", self.transfer_sync_write,
                      (target_hostname, buffer, peer_buffer_address, length), stream_ptr)

    def transfer_read_on_cuda(self, target_hostname, buffer, peer_buffer_address, length,
                              stream_ptr=0, transport_hint=""):
        self._on_cuda("transfer_read_on_cuda", self.transfer_sync_read,
                      (target_hostname, buffer, peer_buffer_address, length), stream_ptr)

    def batch_transfer_write_on_cuda(self, target_hostname, buffers, peer_buffer_addresses,
                                     lengths, stream_ptr=0, transport_hint=""):
        self._on_cuda("batch_transfer_write_on_cuda", self.batch_transfer_sync_write,
                      (target_hostname, buffers, peer_buffer_addresses, lengths), stream_ptr)

    def batch_transfer_read_on_cuda(self, target_hostname, buffers, peer_buffer_addresses,
                                    lengths, stream_ptr=0, transport_hint=""):
        self._on_cuda("batch_transfer_read_on_cuda", self.batch_transfer_sync_read,
                      (target_hostname, buffers, peer_buffer_addresses, lengths), stream_ptr)

    # ---- lifetime ----

    def close(self):
        if self.engine is not None:
            with self._block:
                pending = [h for hs in self._batches.values() for h in hs]
                self._batches.clear()
            for h in pending:
                h.wait(0)
            if self._pool is not None:
                self._pool.close(engine_alive=not self.engine.closed)
            self.engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


_cuda = None


def _cuda_stream_sync(stream_ptr, what):
    global _cuda
    if _cuda is None:
        try:
            _cuda = ctypes.CDLL(os.environ.get("CONNEX_LIBCUDA") or "libcuda.so.1")
        except OSError as exc:
            raise RuntimeError("%s: stream 0x%x given but libcuda.so.1 cannot be loaded: %s"
                               % (what, stream_ptr, exc)) from None
        _cuda.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
        _cuda.cuStreamSynchronize.restype = ctypes.c_int
    r = _cuda.cuStreamSynchronize(stream_ptr)
    if r != 0:
        raise RuntimeError("%s: cuStreamSynchronize(0x%x) failed: CUresult %d"
                           % (what, stream_ptr, r))
