"""A peer process for the tests: one Engine (or TransferEngine) driven by JSON lines on stdin,
answering with one JSON line each on stdout. Its registered buffer holds pattern(size, seed)."""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import connex_c  # noqa: E402


def pattern(n, seed):
    block = bytes((j * 7 + seed) & 0xFF for j in range(256))
    return (block * (n // 256 + 1))[:n]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="peer")
    ap.add_argument("--stage", type=int, default=0)
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--replica", type=int, default=0)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hb", type=int, default=100)
    ap.add_argument("--hbt", type=int, default=1000)
    ap.add_argument("--backend", default=None)
    ap.add_argument("--te", action="store_true", help="run a TransferEngine instead")
    a = ap.parse_args()

    def out(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    te = None
    if a.te:
        te = connex_c.TransferEngine(heartbeat_ms=a.hb, heartbeat_timeout_ms=a.hbt)
        rc = te.initialize("127.0.0.1:%d" % a.port if a.port else "127.0.0.1", "P2PHANDSHAKE",
                           "tcp", "")
        if rc != 0:
            out({"error": rc})
            return 1
        e = te.engine
        out({"url": e.local_url, "port": te.get_rpc_port(), "session": te.get_session_id()})
    else:
        e = connex_c.Engine(a.model, stage=a.stage, shard=a.shard, replica=a.replica, port=a.port,
                            heartbeat_ms=a.hb, heartbeat_timeout_ms=a.hbt, backend=a.backend)
        buf = bytearray(pattern(a.size, a.seed))
        rc = e.register_memory(buf)
        addr = connex_c._args.pointer(buf, True).address
        out({"url": e.local_url, "addr": addr, "size": a.size, "rc": rc,
             "incarnation": e.incarnation})

    for line in sys.stdin:
        c = json.loads(line)
        cmd = c["cmd"]
        if cmd == "dump":
            out({"hex": bytes(buf[c["off"]:c["off"] + c["n"]]).hex()})
        elif cmd == "recv":
            m = e.recv_msg(c.get("timeout", 5000))
            if m is None:
                out({"msg": None})
                continue
            r = {"msg": m.data.hex(), "peer": list(m.peer), "url": m.url, "step": m.step,
                 "from_incarnation": m.from_incarnation}
            if c.get("snap"):     # the bytes the message refers to, as they are on arrival
                spec = json.loads(m.data)
                r["snap"] = bytes(buf[spec["off"]:spec["off"] + spec["n"]]).hex()
            out(r)
        elif cmd == "drain":          # every message until none comes for `quiet` ms
            msgs = []
            while len(msgs) < c.get("max", 10000):
                m = e.recv_msg(c.get("quiet", 500))
                if m is None:
                    break
                msgs.append({"msg": m.data.hex(), "peer": list(m.peer), "step": m.step,
                             "from_incarnation": m.from_incarnation})
            out({"msgs": msgs})
        elif cmd == "send":
            out({"rc": e.send_msg(c["to"], bytes.fromhex(c["data"]))})
        elif cmd == "event":
            out({"event": e.wait_event(c.get("timeout", 5000))})
        elif cmd == "stage":          # pipeline: stage bytes in a managed buffer
            data = bytes.fromhex(c["data"])
            addr = te.allocate_managed_buffer(len(data))
            rc = te.write_bytes_to_buffer(addr, data, len(data)) if addr else -5
            out({"addr": addr, "len": len(data), "rc": rc})
        elif cmd == "peek":
            out({"hex": te.read_bytes_from_buffer(c["addr"], c["len"]).hex()})
        elif cmd == "free":
            out({"rc": te.free_managed_buffer(c["addr"], c["len"]), "pool": te._pool.stats()})
        elif cmd == "stats":
            out({"stats": e.stats()})
        elif cmd == "exit":
            break
        else:
            out({"error": "unknown command %r" % cmd})
    if te:
        te.close()
    else:
        e.close()
    out({"closed": True})
    return 0


if __name__ == "__main__":
    sys.exit(main())
