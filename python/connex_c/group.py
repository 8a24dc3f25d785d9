"""connex_c.Group: a replica group and its steps (docs/mobility.md "Groups", "Steps").

A Group follows every member whose LID matches a pattern (`"llama|1|*|*"`) and sends each step
(a message, or a write then a message) to one live member, handing it to another member when the
first one fails before it queued the step. send() and put_signal() return a Step; Step.wait()
says which member took it and its step id, or raises.

Lifetime: a Group holds its Engine (the engine outlives the group); Engine.close() closes its
open groups before it destroys the engine. A Step holds its Group and its source buffer until it
has been waited for (or reaped when the group closes). A Group that is garbage-collected while
open is closed then.
"""

import ctypes
import logging
import threading
import time

from . import _args
from ._closable import Closable
from ._lib import (CX_ECLOSED, CX_EINPROGRESS, CX_OK, CX_PICK_LEAST_INFLIGHT, CX_PICK_ROUND_ROBIN,
                   cx_lid_t)
from .engine import _PEER_STATES, _SLICE_MS, ConnexError, Engine, EngineClosed, _raise

_log = logging.getLogger("connex_c")

POLICIES = {"round_robin": CX_PICK_ROUND_ROBIN, "least_inflight": CX_PICK_LEAST_INFLIGHT}
_POLICY_NAMES = {v: k for k, v in POLICIES.items()}

# Steps not waited for are reaped (their C op freed) once this many are outstanding, and again
# each time the count doubles: a caller that never waits does not grow memory without bound.
_SWEEP_FIRST = 1024
# How long closing a group waits for one step to report its CX_ECLOSED (it is immediate).
_REAP_S = 10.0


class GroupClosed(ConnexError):
    """A call on a group that was closed (by close(), or by closing its engine)."""

    def __init__(self, what):
        self.code = CX_ECLOSED
        RuntimeError.__init__(self, "%s: the group is closed" % what)


class WaitTimeout(ConnexError, TimeoutError):
    """Step.wait(timeout_s) expired before the step completed; the step is still in flight:
    wait again. .code is CX_EINPROGRESS (what cx_group_wait returns then). Not the step's own
    CX_ETIMEDOUT, which is a ConnexError with code -3."""

    def __init__(self, what):
        self.code = CX_EINPROGRESS
        RuntimeError.__init__(self, "%s: not complete yet (wait again)" % what)


def _policy(policy):
    if isinstance(policy, bool):
        raise TypeError("policy must be 'round_robin' or 'least_inflight', not bool")
    if isinstance(policy, int):
        if policy not in _POLICY_NAMES:
            raise ValueError("policy %d is neither CX_PICK_ROUND_ROBIN (0) nor "
                             "CX_PICK_LEAST_INFLIGHT (1)" % policy)
        return policy
    if not isinstance(policy, str):
        raise TypeError("policy must be 'round_robin' or 'least_inflight', not %s"
                        % type(policy).__name__)
    if policy not in POLICIES:
        raise ValueError("policy %r: want 'round_robin' or 'least_inflight'" % policy)
    return POLICIES[policy]


def _state_name(st):
    return _PEER_STATES[st] if 0 <= st < len(_PEER_STATES) else "unknown"


class Step:
    """One step sent to a group. wait(timeout_s) -> (taken_by, step_id): taken_by is the LID
    tuple (model, stage, shard, replica) of the member that queued it. A step that ended in an
    error raises ConnexError (.code: -2 CX_EPEER no member left, -7 CX_ECLOSED group closed,
    -3, -9 ...; .step and .taken_by as far as known); WaitTimeout when timeout_s passed first."""

    def __init__(self, group, op, keep):
        self._group = group      # the group (and so the engine) outlives the handle
        self._op = op            # c_void_p until cx_group_wait has freed it
        self._keep = keep        # put_signal: the source buffer stays pinned until then
        self._mu = threading.Lock()   # one thread at a time inside cx_group_wait on this op
        self._done = threading.Event()
        self._status = None
        self._taken_by = None
        self._id = 0

    @property
    def done(self):
        """True once the step completed (looks without blocking)."""
        return self._done.is_set() or self._reap(False)

    @property
    def status(self):
        """None while in flight, then the step's status (0 or a negative CX_* code)."""
        return self._status

    @property
    def step_id(self):
        """The step id once complete (0 before): (sender, sender incarnation, step id) names
        the step at its receiver (Message.step)."""
        return self._id

    def wait(self, timeout_s=None):
        """Wait until the step completes (None: no limit; the step itself is bounded by the
        engine's op and connect timeouts). Returns (taken_by, step_id) or raises. The GIL is
        free while waiting; waiting again after completion gives the same answer."""
        tmo = _args.timeout_s(timeout_s)
        deadline = None if tmo < 0 else time.monotonic() + tmo / 1000.0
        first = True
        while not self._done.is_set():
            left = None if deadline is None else deadline - time.monotonic()
            if not first and left is not None and left <= 0:
                break
            first = False
            if not self._mu.acquire(timeout=-1 if left is None else max(0.0, left)):
                break     # another thread is waiting on it; it did not complete in our time
            try:
                if not self._done.is_set():
                    self._poll(_SLICE_MS if left is None else
                               min(_SLICE_MS, max(0, int(left * 1000))))
            finally:
                self._mu.release()
        if not self._done.is_set():
            raise WaitTimeout("step of group %s" % self._group.pattern)
        return self._result()

    # cx_group_wait frees the op when it returns its status; when its timeout expires first it
    # returns CX_EINPROGRESS (never a step's own status) and the op stays valid. Called with
    # self._mu held.
    def _poll(self, ms):
        lid = cx_lid_t()
        sid = ctypes.c_uint64(0)
        rc = self._group._lib.cx_group_wait(self._op, ms, ctypes.byref(lid), ctypes.byref(sid))
        if rc == CX_EINPROGRESS:
            return False
        self._status = rc
        self._id = sid.value
        self._taken_by = lid.as_tuple() if lid.model else None
        self._op = None
        self._keep = None
        self._group._forget(self)
        self._done.set()
        return True

    def _reap(self, block):
        """Complete the step (free its op) for close or a sweep; False when it is still in
        flight (or, without block, another thread is waiting on it)."""
        if not self._mu.acquire(blocking=block):
            return False
        try:
            if self._done.is_set():
                return True
            if not block:
                return self._poll(0)
            deadline = time.monotonic() + _REAP_S
            while not self._poll(_SLICE_MS):
                if time.monotonic() >= deadline:
                    return False
            return True
        finally:
            self._mu.release()

    def _result(self):
        if self._status == CX_OK:
            return self._taken_by, self._id
        try:
            _raise(self._status, "step %d of group %s" % (self._id, self._group.pattern))
        except ConnexError as exc:
            exc.step = self._id
            exc.taken_by = self._taken_by
            raise

    def __repr__(self):
        if not self.done:
            return "<connex_c.Step in flight>"
        return "<connex_c.Step %d status %d taken_by %r>" % (self._id, self._status, self._taken_by)


class Group(Closable):
    """A replica group: Group(engine, "model|stage|*|*", policy="round_robin") or
    engine.group(...). Policies: "round_robin", "least_inflight". Use it as a context manager
    or close() it. Wrong Python types raise TypeError, impossible values ValueError, arguments
    libconnex refuses InvalidArgument (its log line on stderr says why), calls on a closed group
    GroupClosed, on a closed engine EngineClosed."""

    def __init__(self, engine, pattern, policy="round_robin"):
        if not isinstance(engine, Engine):
            raise TypeError("engine must be a connex_c.Engine, not %s" % type(engine).__name__)
        pat = _args.pattern(pattern)
        pol = _policy(policy)
        self._engine = engine
        self._lib = engine._lib
        self._g = None
        self._cond = threading.Condition()
        self._active = 0
        self._closing = False
        self._steps = {}                  # id(step) -> Step not yet waited for
        self._steps_mu = threading.Lock()
        self._sweep_at = _SWEEP_FIRST
        self.pattern = pat.decode()
        self.policy = _POLICY_NAMES[pol]
        out = ctypes.c_void_p()
        e = engine._enter("group")
        try:
            rc = self._lib.cx_group_open(e, pat, pol, ctypes.byref(out))
            if rc == CX_OK:
                self._g = out
                engine._groups.add(self)   # inside _enter: the engine cannot be closing yet
        finally:
            engine._leave()
        if rc != CX_OK:
            self._closing = True
            _raise(rc, "group(%r, %r)" % (self.pattern, self.policy))

    # ---- lifetime ----

    def _enter(self, what):
        self._engine._enter("group " + what)
        with self._cond:
            if self._closing or self._g is None:
                self._engine._leave()
                raise GroupClosed("group %s: %s" % (self.pattern, what))
            self._active += 1
            return self._g

    def _leave(self):
        with self._cond:
            self._active -= 1
            if self._active == 0:
                self._cond.notify_all()
        self._engine._leave()

    def close(self):
        """End every step still in flight (their wait() raises ConnexError CX_ECLOSED) and stop
        following the members. Idempotent; a no-op once the engine is closed (it closed us)."""
        try:
            self._engine._enter("group close")
        except EngineClosed:
            return        # Engine.close() closes its groups before the engine goes
        try:
            self._shutdown()
        finally:
            self._engine._leave()

    def _shutdown(self):
        """With the engine alive and held: wait for calls in other threads, close the C group,
        then reap every step handle (they completed with CX_ECLOSED or before)."""
        with self._cond:
            if self._closing:
                return
            self._closing = True
            while self._active:
                self._cond.wait()
            g, self._g = self._g, None
        if g is None:
            return
        self._lib.cx_group_close(g)
        with self._steps_mu:
            pending = list(self._steps.values())
        for s in pending:
            if not s._reap(True):
                _log.error("connex_c: a step of group %s did not complete after "
                           "cx_group_close", self.pattern)
        self._engine._groups.discard(self)

    @property
    def closed(self):
        return self._g is None

    def __repr__(self):
        return "<connex_c.Group %s %s%s>" % (self.pattern, self.policy,
                                             " closed" if self.closed else "")

    # ---- members ----

    def add(self, url):
        """Add a member by URL `ip:port#model|stage|shard|replica` (its LID must match the
        pattern); the group dials it. Adding it again clears a mark_failed mark."""
        u = _args.text(url, "url", allow_none=False)
        g = self._enter("add")
        try:
            rc = self._lib.cx_group_add(g, u)
        finally:
            self._leave()
        if rc != CX_OK:
            _raise(rc, "group %s: add(%r)" % (self.pattern, url))

    def members(self):
        """Every member: a list of {"lid": (model, stage, shard, replica), "state":
        "unknown"|"connecting"|"up"|"suspect"|"failed"|"left"} (a member marked failed reads
        "failed" while it is up)."""
        n = 16
        while True:
            lids = (cx_lid_t * n)()
            states = (ctypes.c_int * n)()
            g = self._enter("members")
            try:
                rc = self._lib.cx_group_members(g, lids, states, n)
            finally:
                self._leave()
            if rc < 0:
                _raise(rc, "group %s: members" % self.pattern)
            if rc <= n:
                break
            n = rc + 16   # members joined meanwhile: ask again with room for them
        return [{"lid": lids[i].as_tuple(), "state": _state_name(states[i])} for i in range(rc)]

    def pick(self):
        """The member the policy would take now, as a LID tuple (nothing is sent; round robin
        does not move on). Raises ConnexError CX_EPEER (-2) when no member is usable."""
        lid = cx_lid_t()
        g = self._enter("pick")
        try:
            rc = self._lib.cx_group_pick(g, ctypes.byref(lid))
        finally:
            self._leave()
        if rc != CX_OK:
            _raise(rc, "group %s: pick" % self.pattern)
        return lid.as_tuple()

    def mark_failed(self, lid):
        """Skip this member (a LID tuple, LID string or URL) until it comes up or joins again;
        its steps in flight go to other members."""
        b = _args.lid(lid)
        g = self._enter("mark_failed")
        try:
            rc = self._lib.cx_group_mark_failed(g, b)
        finally:
            self._leave()
        if rc != CX_OK:
            _raise(rc, "group %s: mark_failed(%r)" % (self.pattern, lid))

    # ---- steps ----

    def send(self, msg):
        """Send a message (bytes-like, copied) to one live member; returns a Step."""
        m = _args.message(msg)
        return self._submit("send", lambda g, op: self._lib.cx_group_send(
            g, m, len(m), op), None)

    def put_signal(self, src, remote_offset, msg, n=None):
        """Write n bytes of src (local, inside a registered region; n defaults to its size) to
        remote_offset bytes into the first region the chosen member registered, then deliver
        msg there; returns a Step. src stays referenced until the step has been waited for."""
        p = _args.pointer(src, writable=False, what="source")
        if n is None:
            if p.size is None:
                raise TypeError("put_signal: give the length n for a raw address")
            n = p.size
        _args.length(n)
        if n == 0:
            raise ValueError("put_signal: length is 0")
        p.check_len(n, "put_signal")
        roff = _args.remote_addr(remote_offset, "remote_offset")
        m = _args.message(msg)
        return self._submit("put_signal", lambda g, op: self._lib.cx_group_put_signal(
            g, p.address, n, roff, m, len(m), op), p)

    def _submit(self, what, call, keep):
        op = ctypes.c_void_p()
        g = self._enter(what)
        try:
            rc = call(g, ctypes.byref(op))
            if rc == CX_OK:
                s = Step(self, op, keep)
                with self._steps_mu:       # registered before close() can look
                    self._steps[id(s)] = s
                    sweep = len(self._steps) >= self._sweep_at
        finally:
            self._leave()
        if rc != CX_OK:
            _raise(rc, "group %s: %s" % (self.pattern, what))
        if sweep:
            self._sweep()
        return s

    def _sweep(self):
        with self._steps_mu:
            pending = list(self._steps.values())
        for s in pending:
            s._reap(False)
        with self._steps_mu:
            self._sweep_at = max(_SWEEP_FIRST, 2 * len(self._steps))

    def _forget(self, step):
        with self._steps_mu:
            self._steps.pop(id(step), None)

    @property
    def steps_pending(self):
        """Step handles not yet waited for (or reaped)."""
        with self._steps_mu:
            return len(self._steps)
