"""Engine.metrics(): the Prometheus text of cx_stats_format, checked line by line."""

import re

from connex_c import Engine

N = 1 << 16

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*",?)*\})? '
                     r'(-?[0-9.e+-]+|\+Inf|-Inf|NaN)$')


def _series(text):
    out = {}
    types = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            assert name not in types, "TYPE of %s twice" % name
            types[name] = kind
            continue
        if line.startswith("# HELP "):
            continue
        assert _SAMPLE.match(line), "not a sample line: %r" % line
        key, value = line.rsplit(" ", 1)
        assert key not in out, "series twice: %s" % key
        out[key] = float(value)
    return out, types


def test_metrics_text(engine, peers):
    peer = peers.start("--model", "mtext", "--size", N, "--seed", 4)
    buf = bytearray(N)
    assert engine.register_memory(buf) == 0
    for _ in range(200):
        assert engine.transfer_sync_read(peer.url, buf, peer.hello["addr"], 4096) == 0
    text = engine.metrics()
    assert text.endswith("\n")
    series, types = _series(text)
    assert types["connex_op_latency_seconds"] == "histogram"
    assert series['connex_ops_total{op="read"}'] >= 200
    lid = peer.url.split("#", 1)[1]
    assert series['connex_peer_state{peer="%s",state="up"}' % lid] == 1
    assert series['connex_peer_ops_total{peer="%s",op="read"}' % lid] >= 200
    count = sum(v for k, v in series.items()
                if k.startswith('connex_op_latency_seconds_count{op="read"'))
    assert 0 < count < 200   # one op in 8 is timed


def test_metrics_closed_engine():
    e = Engine("mclosed")
    e.close()
    try:
        e.metrics()
    except Exception as exc:   # the binding's error for a closed engine
        assert "closed" in str(exc).lower()
    else:
        raise AssertionError("metrics() on a closed engine did not raise")
