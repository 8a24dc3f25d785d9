#!/usr/bin/env python3
"""Write docs/results.md (and its plot) from connex-bench --json files.

Usage:
  bench/results_md.py [--commit REV] [--out docs/results.md] [--plot docs/results-transfer.png]
                      [--note TEXT] FILE.json [FILE.json ...]

Each FILE is what `connex-bench transfer|failover|soak --json FILE` wrote. Every table states
the date, host and command recorded in its file and the commit the run was built from: the file's
own "commit" field where it has one, else --commit (default: the checkout's `git rev-parse --short
HEAD`). Runs taken at different commits keep each its own; a soak row with a "commit" of its
own (a variant run again alone, merged into the file) names it and its "date" in its verdict.

A soak run is long (minutes per 100 kills). When no file holds soak rows, the section of the
existing output between the markers `<!-- soak:begin -->` and `<!-- soak:end -->` is kept as it
is (a reference table entered by hand, which states where it came from). So is the section between
`<!-- staged:begin -->` and `<!-- staged:end -->` (device memory staged on both sides, runs the
text compares with each other) whenever the files hold no row of device memory.

A transfer file whose rows all moved batches (`connex-bench transfer --batch N`) gets a section
of its own, "Batches", after the single-op one.

Python 3 standard library only; gnuplot (Debian: gnuplot-nox) for --plot.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap

OPS = ("read", "write", "put_signal")
WIDTH = 98
SOAK_BEGIN = "<!-- soak:begin -->"
SOAK_END = "<!-- soak:end -->"
STAGED_BEGIN = "<!-- staged:begin -->"
STAGED_END = "<!-- staged:end -->"
VARIANT_ORDER = ("ucx_shm", "ucx_tcp", "libfabric_shm", "libfabric_tcp", "zmq")
CX_COLOUR = "#1f77b4"    # connex-c, every panel
RAW_COLOUR = "#d62728"   # the raw loop of the same transport, every panel
TCP_COLOUR = "#7f7f7f"   # raw TCP loopback socket, every panel


def raw_baseline(variant):
    """The raw-library row a connex variant is compared with (bench/README.md, baselines)."""
    if variant.startswith("ucx_"):
        return "ucx_raw(%s)" % variant
    if variant.startswith("libfabric_"):
        return "fi_raw(%s)" % variant
    if variant == "zmq":
        return "raw_zmq"
    return None


def size_str(n):
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return "%d %s" % (n // div, unit)
    return "%d B" % n


def us_str(us):
    if us is None or us <= 0:
        return "-"
    if us >= 10000:
        return "%.1f ms" % (us / 1000.0)
    if us >= 100:
        return "%.0f us" % us
    return "%.1f us" % us


def ms_triplet(d):
    if not d or not d.get("n"):
        return "-"
    return "%.1f / %.1f / %.1f" % (d["p50_ms"], d["p99_ms"], d["max_ms"])


def para(text):
    """A prose paragraph wrapped like the rest of the docs (tables and code stay as they are)."""
    return textwrap.fill(text, WIDTH, break_long_words=False, break_on_hyphens=False).splitlines()


def md_escape(s):
    return str(s).replace("|", "\\|")


def header(doc, commit, what):
    """The provenance lines every table starts with."""
    return para("Date %s, commit %s, host `%s` (Linux %s, %s CPUs), %s:" % (
        doc.get("date", "?"), doc.get("commit") or commit, doc.get("host", "?"), doc.get("kernel", "?"),
        doc.get("cpus", "?"), what)) + [
        "",
        "```sh",
        doc.get("command", "?"),
        "```",
        "",
    ]


def order_key(variant):
    return VARIANT_ORDER.index(variant) if variant in VARIANT_ORDER else len(VARIANT_ORDER)


def transfer_rows(doc):
    """The rows of a plain run; of a --rounds run, per op, size and backend the round with the
    lowest p50 (another tenant of the host only adds time)."""
    rows = doc.get("transfer", [])
    if rounds_of(doc) <= 1:
        return rows
    best = {}
    for r in rows:
        k = (r["op"], r["size"], r["backend"])
        if r.get("p50_us", 0) > 0 and (k not in best or r["p50_us"] < best[k]["p50_us"]):
            best[k] = r
    return list(best.values())


def rounds_of(doc):
    """Rounds are counted from 0 in the JSON."""
    return 1 + max([r.get("round", 0) for r in doc.get("transfer", [])] or [0])


def connex_variants(rows):
    vs = {r["backend"] for r in rows if not r.get("baseline") and r["op"] in OPS}
    return sorted(vs, key=lambda v: (order_key(v), v))


def batch_of(rows):
    """N when every connex row moved N blocks per call (a --batch run), else 0."""
    ns = {r.get("batch", 0) for r in rows if not r.get("baseline") and r["op"] in OPS}
    return ns.pop() if len(ns) == 1 else 0


def section_transfer(doc, commit, plot_rel):
    rows = transfer_rows(doc)
    if not rows:
        return []
    nb = batch_of(rows)
    out = ["## Transfer", ""] if not nb else [
        "## Batches", "",
        "%d blocks of one size per call (`cx_batch_read` / `cx_batch_write`), p50 per call; "
        "GB/s = %d x size / p50. The raw loops post the same %d ops and wait for all of them."
        % (nb, nb, nb), ""]
    n = rounds_of(doc)
    out += header(doc, commit, "one engine and one peer process per variant, loopback" +
                  ("; %d rounds, every table below but the paired one shows each point's "
                   "round with the lowest p50" % n if n > 1 else ""))
    cx = [r for r in rows if not r.get("baseline") and r["op"] in OPS]
    bad = [r for r in cx if not str(r.get("result", "")).startswith("ok")]
    out += ["%d of %d connex-c points passed their data checks%s." % (
        len(cx) - len(bad), len(cx),
        "" if not bad else "; failed: " + ", ".join("%s %s %s" % (r["backend"], r["op"],
                                                                  size_str(r["size"])) for r in bad)),
            ""]
    if plot_rel:
        out += ["![p50 latency per op and backend, connex-c beside its raw loop](%s)" % plot_rel, ""]
    by = {(r["op"], r["size"], r["backend"]): r for r in rows}
    variants = connex_variants(rows)
    sizes = sorted({r["size"] for r in rows if r["op"] in OPS})

    out += ["### connex-c against the raw loop of its transport (p50)", "",
            "Raw loops: `ucx_raw` (`ucp_get`/`ucp_put` under the variant's `UCX_TLS`), `fi_raw` "
            "(`fi_read`/`fi_write` on the variant's provider), `raw_zmq` (DEALER/ROUTER round "
            "trip; for batches, `raw_tcp`: the same blocks per call over a TCP socket). They run in the same invocation, one after the other; put_signal has no raw "
            "counterpart.", "",
            "| op | size | backend | connex-c p50 | raw p50 | connex / raw |",
            "|---|---|---|---|---|---|"]
    for op in ("read", "write"):
        for size in sizes:
            for v in variants:
                r = by.get((op, size, v))
                raw = by.get((op, size, raw_baseline(v) or ""))
                if not raw and v == "zmq":
                    raw = by.get((op, size, "raw_tcp"))  # batches: raw_zmq does not batch
                if not r:
                    continue
                ratio = "-"
                if raw and raw.get("p50_us", 0) > 0 and r.get("p50_us", 0) > 0:
                    ratio = "%.2f" % (r["p50_us"] / raw["p50_us"])
                out.append("| %s | %s | %s | %s | %s | %s |" % (
                    op, size_str(size), v, us_str(r.get("p50_us")),
                    us_str(raw.get("p50_us")) if raw else "-", ratio))
    out.append("")

    vs = doc.get("vs_raw") or []
    if any(p.get("rounds", 0) > 1 for p in vs):
        out += ["### Paired rounds (`--rounds`)", "",
                "Each round's connex p50 over the raw p50 of the same round; median, range, and "
                "`best` (lowest connex p50 over lowest raw p50). `read x128`: 128 blocks per call "
                "(`--batch`), one batch against the raw loop posting the same 128 ops.", "",
                "| op | size | backend | raw | rounds | connex p50 | raw p50 | ratio | range | best |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for p in vs:
            out.append("| %s | %s | %s | %s | %d | %s | %s | %.2f | %.2f-%.2f | %.2f |" % (
                p["op"] + (" x%d" % p["batch"] if p.get("batch") else ""), size_str(p["size"]),
                p["backend"], p["raw"], p["rounds"],
                us_str(p["p50_us"]), us_str(p["raw_p50_us"]), p["ratio"], p["ratio_min"],
                p["ratio_max"], p["ratio_best"]))
        out.append("")

    out += ["### Every row", "",
            "Latency per op, p50/p99/max by nearest rank; GB/s = size / p50. `pair` is the "
            "backend the pair really used. Baseline rows (`raw_*`, `ucx_raw`, `fi_raw`, "
            "`ucx_perftest`, `memcpy`) report what their tool reports (several p50 only).", ""]
    for op in OPS + ("copy",):
        ops = [r for r in rows if r["op"] == op]
        if not ops:
            continue
        ops.sort(key=lambda r: (r["size"], r.get("baseline", False),
                                order_key(r["backend"]), r["backend"]))
        out += ["#### %s" % op, "",
                "| size | backend | pair | iters | p50 | p99 | max | GB/s | result |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in ops:
            out.append("| %s | %s | %s | %d | %s | %s | %s | %.3f | %s |" % (
                size_str(r["size"]), md_escape(r["backend"]), md_escape(r.get("pair", "-")),
                r.get("iters", 0), us_str(r.get("p50_us")), us_str(r.get("p99_us")),
                us_str(r.get("max_us")), r.get("gbps", 0.0), md_escape(r.get("result", ""))))
        out.append("")
    return out


def section_failover(doc, commit):
    fos = doc.get("failover") or []
    if not fos:
        return []
    out = ["## Failover", ""]
    out += header(doc, commit, "a thread keeps 1 MiB reads in flight when the fault hits")
    okr, runs = sum(r["ok"] for r in fos), sum(r["runs"] for r in fos)
    out += ["Heartbeat as the command sets it (default: every 200 ms, FAILED after 5 intervals "
            "without one, SUSPECT one interval before). SIGKILL is seen by the same-host death "
            "watch, SIGSTOP and link down by heartbeat. %d of %d runs passed (a fault a variant "
            "cannot have, link down between shared-memory processes, is skipped)." % (okr, runs),
            "",
            "Times in ms, p50 / p99 / max over the runs. Event times are the engine's own stamps; "
            "\"start\" is the fork of the restarted peer process, \"engine up\" the moment its "
            "engine existed.", "",
            "| backend | fault | ok | fault to first event | fault to FAILED | fault to in-flight op "
            "returned | start to first transfer | engine up to first transfer | note |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in fos:
        out.append("| %s | %s | %d/%d | %s | %s | %s | %s | %s | %s |" % (
            r["backend"], r["fault"], r["ok"], r["runs"], ms_triplet(r.get("fault_to_first_event")),
            ms_triplet(r.get("fault_to_failed")), ms_triplet(r.get("fault_to_inflight_return")),
            ms_triplet(r.get("start_to_first_transfer")),
            ms_triplet(r.get("engine_up_to_first_transfer")), md_escape(r.get("note", ""))))
    out.append("")
    return out


def verdict_of(doc, row):
    """A row run at another commit than its file's says which (a variant run again alone)."""
    v = row.get("verdict", "")
    if row.get("commit") and row.get("commit") != doc.get("commit"):
        v += " (commit %s, %s)" % (row["commit"], row.get("date", "?"))
    return v


def section_soak(doc, commit):
    soaks = doc.get("soak") or []
    if not soaks:
        return []
    out = [SOAK_BEGIN, "## Survivor soak: kill -9 at random moments under load", ""]
    out += header(doc, commit, "a peer killed with kill -9 at a random moment while 4 survivor "
                  "threads run checked reads, writes, put_signals and batches to it, then restarted "
                  "under the same identity and port")
    out += ["\"unreg\" counts ops that reached the new process before it had registered its memory "
            "(`CX_EINVAL` for an op started before the peer's registration). Times in ms, "
            "p50 / p99 / max.", "",
            "| variant | kills | ok / EPEER / ETIMEDOUT / unreg / other | bad data | fds start/warm/end "
            "| RSS KiB start/warm/end | kill to FAILED | start to first transfer | engine up to first "
            "transfer | verdict |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for s in soaks:
        t = {k: 0 for k in ("ok", "epeer", "etimedout", "unregistered", "other", "bad_data")}
        for kind in (s.get("ops") or {}).values():
            for k in t:
                t[k] += kind.get(k, 0)
        fds, rss = s.get("fds", {}), s.get("rss_kib", {})
        out.append("| %s | %d/%d | %d/%d/%d/%d/%d | %d | %s/%s/%s | %s/%s/%s | %s | %s | %s | %s |" % (
            s["backend"], s.get("done", 0), s.get("kills", 0), t["ok"], t["epeer"], t["etimedout"],
            t["unregistered"], t["other"], t["bad_data"], fds.get("start"), fds.get("warm"),
            fds.get("end"), rss.get("start"), rss.get("warm"), rss.get("end"),
            ms_triplet(s.get("kill_to_failed")), ms_triplet(s.get("start_to_first_transfer")),
            ms_triplet(s.get("engine_up_to_first_transfer")), md_escape(verdict_of(doc, s))))
    flat = [s["backend"] for s in soaks
            if list(s.get("regions", [0, 0]))[:1] * 2 == list(s.get("regions", [0, 0]))
            and list(s.get("registered_bytes", [0, 0]))[:1] * 2 == list(s.get("registered_bytes", [0, 0]))]
    crashed = ["%s (signal %d)" % (s["backend"], s["crash_signal"]) for s in soaks if s.get("crash_signal")]
    out += ["", "Registered regions and bytes the same at the end as at the start: %s." % (
        ", ".join(flat) if flat else "none")]
    if crashed:
        out += ["", "Survivor crashed: %s." % ", ".join(crashed)]
    out += ["", SOAK_END, ""]
    return out


def kept_block(path, begin, end):
    """A hand-entered section of an existing output, markers included."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return []
    a, b = text.find(begin), text.find(end)
    if a < 0 or b < a:
        return []
    return text[a:b + len(end)].splitlines() + [""]


def has_device_rows(doc):
    return any(r.get("mem_local", "host") != "host" or r.get("mem_remote", "host") != "host"
               for r in doc.get("transfer", []))


def gnuplot_script(doc, png):
    """One panel per op (rows) and backend (columns): connex-c p50 beside its own raw loop and
    the raw TCP socket loop, the same colour for each of the three in every panel."""
    rows = transfer_rows(doc)
    by = {(r["op"], r["size"], r["backend"]): r for r in rows}
    variants = connex_variants(rows)
    ops = [op for op in OPS if any(r["op"] == op for r in rows)]
    if not variants or not ops:
        return None
    sizes = sorted({r["size"] for r in rows if r["op"] in OPS})
    g = ["set terminal pngcairo size %d,%d noenhanced font ',9'" % (330 * len(variants) + 60,
                                                                    300 * len(ops) + 60),
         "set output '%s'" % png.replace("'", "''"),
         "set logscale x 2",
         "set logscale y 10",
         "set xtics (%s)" % ", ".join("'%s' %d" % (size_str(n).replace(" ", ""), n) for n in sizes),
         "set xrange [%d:%d]" % (sizes[0] // 2, sizes[-1] * 2),
         "set ylabel 'p50, us'",
         "set grid",
         "set key top left font ',8'",
         "set multiplot layout %d,%d title 'connex-bench transfer: p50 latency (us) by size, "
         "%s, %s'" % (len(ops), len(variants), doc.get("date", ""), doc.get("host", ""))]
    series = [("connex-c", lambda op, v: v, CX_COLOUR, 1),
              ("raw", lambda op, v: raw_baseline(v), RAW_COLOUR, 1),
              ("raw TCP socket", lambda op, v: "raw_tcp", TCP_COLOUR, 2)]
    for op in ops:
        for v in variants:
            g.append("set title '%s, %s'" % (op, v))
            plots = []
            for label, name_of, colour, dash in series:
                name = name_of(op, v)
                pts = [(s, by[(op, s, name)]["p50_us"]) for s in sizes
                       if name and (op, s, name) in by and by[(op, s, name)].get("p50_us", 0) > 0]
                if not pts:
                    continue
                block = "$d_%s_%s_%d" % (op, v, len(plots))
                g.append("%s << EOD" % block)
                g += ["%d %.3f" % p for p in pts]
                g.append("EOD")
                title = label if label != "raw" else name
                plots.append("%s using 1:2 with linespoints lc rgb '%s' dt %d pt 7 ps 0.6 "
                             "title '%s'" % (block, colour, dash, title))
            if plots:
                g.append("plot " + ", ".join(plots))
            else:
                g += ["set label 1 'no data' at graph 0.5,0.5", "plot NaN notitle", "unset label 1"]
    g.append("unset multiplot")
    return "\n".join(g) + "\n"


STATIC_HEAD = """# Results: connex-bench

The reference run of `connex-bench` on its development host. This file is generated by
`bench/results_md.py` from the JSON that `connex-bench --json` writes (bench/README.md,
"Reference results"); do not edit the generated tables by hand.

Two processes on one host, over loopback and shared memory. The numbers show that every backend
moves verified data end to end and where each stands next to the raw library it is built on, on
the host named in each table; on a host without RDMA devices they say nothing about RDMA.

Variants: `ucx_shm` (UCX_TLS=posix,cma,self), `ucx_tcp` (UCX_TLS=tcp,self), `libfabric_shm`,
`libfabric_tcp` (tcp;ofi_rxm), `zmq`. Every connex row was checked outside its timed loop (reads
against the peer's pattern, writes read back, every put_signal message checked at the peer).
Defaults: at most 200 timed iterations or 250 ms per point (at least 3), warm-up 2..20 ops.
"""

STATIC_TAIL = """## What these numbers do not show

- Anything about RDMA NICs, EFA, GPUDirect or GPUs where the host has none: `ucx_*` and
  `libfabric_*` then run on shared memory and TCP loopback only.
- Multi-host behaviour: the link-down fault runs two network namespaces on one kernel.
- Stable tails: p99/max on a small shared VM are scheduling noise.
- The raw tool rows are p50 only and some are not comparable op for op: `ucx_perftest` put_bw
  posts without waiting per op; its shm `ucp_get` is a load from mapped memory (rkey_ptr), not a
  transfer protocol; `ucx_raw`/`ucx_perftest` over tcp stall when UCX's target does not poll.
  A single run compares connex with a raw loop taken seconds apart; `--rounds N` pairs them per
  round (bench/README.md).
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+", help="files written by connex-bench --json")
    ap.add_argument("--out", default="docs/results.md")
    ap.add_argument("--plot", default=None,
                    help="PNG to draw from the first file with transfer rows (gnuplot); "
                         "the markdown links it relative to --out")
    ap.add_argument("--gnuplot-script", default=None, help="also keep the gnuplot script here")
    ap.add_argument("--commit", default=None, help="the commit the run was built from")
    ap.add_argument("--note", action="append", default=[],
                    help="a paragraph added under the head (repeatable)")
    a = ap.parse_args()

    commit = a.commit
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"

    docs = []
    for path in a.json:
        with open(path, encoding="utf-8") as f:
            docs.append(json.load(f))

    plot_rel = None
    tdoc = next((d for d in docs if transfer_rows(d) and not batch_of(transfer_rows(d))), None)
    if a.plot and tdoc:
        gp = gnuplot_script(tdoc, a.plot)
        if gp:
            if a.gnuplot_script:
                with open(a.gnuplot_script, "w", encoding="utf-8") as f:
                    f.write(gp)
            if shutil.which("gnuplot"):
                r = subprocess.run(["gnuplot"], input=gp, text=True)
                if r.returncode == 0 and os.path.exists(a.plot):
                    plot_rel = os.path.relpath(a.plot, os.path.dirname(os.path.abspath(a.out)) or ".")
                else:
                    print("results_md: gnuplot failed (status %d)" % r.returncode, file=sys.stderr)
            else:
                print("results_md: gnuplot not found (Debian: gnuplot-nox); no plot",
                      file=sys.stderr)

    out = STATIC_HEAD.splitlines() + [""]
    for n in a.note:
        out += para(n) + [""]
    soak = []
    for d in docs:
        soak += section_soak(d, commit)
    if not soak:
        soak = kept_block(a.out, SOAK_BEGIN, SOAK_END)
    staged = [] if any(has_device_rows(d) for d in docs) else kept_block(a.out, STAGED_BEGIN, STAGED_END)
    # Single ops first, then batches.
    for d in sorted(docs, key=lambda d: batch_of(transfer_rows(d)) > 0):
        out += section_transfer(d, commit, plot_rel if d is tdoc else None)
    for d in docs:
        out += section_failover(d, commit)
    out += soak
    out += staged
    out += STATIC_TAIL.splitlines()

    wrapped, code = [], False
    for line in out:
        if line.startswith("```"):
            code = not code
        if code or len(line) <= WIDTH or line.startswith(("|", "!", "#", " ", "<!--")):
            wrapped.append(line)
        else:
            wrapped += para(line)
    text = "\n".join(wrapped).rstrip("\n") + "\n"
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(text)
    print("results_md: wrote %s (%d lines)%s" % (a.out, text.count("\n"),
                                                 ", plot %s" % a.plot if plot_rel else ""),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
