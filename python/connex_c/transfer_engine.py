"""connex_c.TransferEngine: the part of Mooncake Transfer Engine's Python surface that pipeline
code uses, over a connex Engine. Same return conventions: 0 or a negative code, addresses as
ints, allocate_managed_buffer returns 0 on failure.

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
import ipaddress
import logging
import os
import socket

from . import _args
from ._lib import CX_EINVAL, CX_EUNSUPPORTED, CX_OK
from ._pool import ManagedPool
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


class TransferEngine:
    """Mooncake-style transfer engine. Create, then initialize(); methods mirror Mooncake's."""

    def __init__(self, **engine_kwargs):
        """engine_kwargs go to connex_c.Engine (heartbeat_ms, op_timeout_ms, ...)."""
        self._kw = engine_kwargs
        self.engine = None
        self._pool = None
        self._regions = {}                # user-registered: address -> length

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
        self._pool = ManagedPool(self.engine.register_memory, self.engine.unregister_memory,
                                 DEFAULT_POOL_BYTES)
        return CX_OK

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

    def get_rpc_port(self):
        return self._e().port

    def get_local_url(self):
        """This engine's full URL (what a peer with a non-default LID needs)."""
        return self._e().local_url

    def get_session_id(self):
        url = self._e().local_url
        return url.split("#", 1)[0]

    def target(self, target_hostname):
        """The connex peer name for a Mooncake target name."""
        _args.text(target_hostname, "target_hostname", allow_none=False)
        if "#" in target_hostname or "|" in target_hostname:
            return target_hostname
        ip, port = split_hostport(target_hostname, need_port=True)
        return _url(ip, port, default_lid(ip, port))

    # ---- memory ----

    def register_memory(self, buffer_addr, capacity):
        p = _args.pointer(buffer_addr, writable=True, what="buffer_addr")
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

    def allocate_managed_buffer(self, length):
        """The address of `length` bytes of registered memory (from the pool), or 0."""
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
        """Copy length bytes of src (bytes-like) to dest_address; 0."""
        data = _args.message(src) if not isinstance(src, (bytes, bytearray)) else src
        _args.length(length)
        if length > len(data):
            raise ValueError("write_bytes_to_buffer: length %d > %d bytes given"
                             % (length, len(data)))
        self._check_local(dest_address, length, "write_bytes_to_buffer")
        ctypes.memmove(dest_address, bytes(data[:length]), length)
        return CX_OK

    def read_bytes_from_buffer(self, source_address, length):
        self._check_local(source_address, length, "read_bytes_from_buffer")
        return ctypes.string_at(source_address, length)

    # ---- transfers ----

    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length):
        return self._e().transfer_sync_read(self.target(target_hostname), buffer,
                                            peer_buffer_address, length)

    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length):
        return self._e().transfer_sync_write(self.target(target_hostname), buffer,
                                             peer_buffer_address, length)

    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                                 statuses=None):
        """One batch (one call into the engine, one completion): 0, or the first failed entry's
        status. A list passed as statuses receives every entry's, in order."""
        return self._batch(self._e().transfer_batch_read, target_hostname, buffers,
                           peer_buffer_addresses, lengths, statuses)

    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                                  statuses=None):
        return self._batch(self._e().transfer_batch_write, target_hostname, buffers,
                           peer_buffer_addresses, lengths, statuses)

    def _batch(self, fn, target, bufs, addrs, lens, statuses):
        if not (len(bufs) == len(addrs) == len(lens)):
            raise ValueError("batch: buffers, peer addresses and lengths differ in length")
        if not bufs:
            return CX_OK
        st = fn(self.target(target), bufs, addrs, lens)
        if statuses is not None:
            statuses[:] = st
        return next((rc for rc in st if rc != CX_OK), CX_OK)

    # ---- lifetime ----

    def close(self):
        if self.engine is not None:
            if self._pool is not None:
                self._pool.close(engine_alive=not self.engine.closed)
            self.engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
