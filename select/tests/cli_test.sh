#!/bin/sh
# connex-probe end to end: text, --json (valid JSON), --config, exit codes, a synthetic DGX sysfs
# tree.
# usage: cli_test.sh CONNEX_PROBE CX_MKFIXTURE FIXTURES_DIR
set -u
probe=$1 mk=$2 fx=$3
dir=$(mktemp -d -t cx-sysfs-cli-XXXXXX) || exit 1
trap 'rm -rf "$dir"' EXIT INT TERM
export CONNEX_PROBE_CUDA=0
unset CONNEX_BACKEND CONNEX_NET_DEVICES CONNEX_GDR CONNEX_FI_PROVIDER
fails=0
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi; }

"$mk" "$fx/dgx-h100-8gpu-8nic.layout" "$dir/sys" || { echo "fixture failed"; exit 1; }

out=$(timeout 20 "$probe"); rc=$?
check "plain run exits 0 where a backend is built" "[ $rc -eq 0 ]"
check "plain run prints the decision" "echo \"\$out\" | grep -q '^decision: ok'"

out=$(timeout 20 "$probe" --json --sysfs "$dir/sys"); rc=$?
check "--json --sysfs exits 0" "[ $rc -eq 0 ]"
if command -v python3 >/dev/null; then
    check "--json is valid JSON with 8 GPUs and 12 RDMA devices" \
        "echo \"\$out\" | python3 -c 'import json,sys; d=json.load(sys.stdin); p=d[\"probe\"]; assert len(p[\"gpus\"])==8 and len(p[\"rdma\"])==12, p; assert d[\"decision\"][\"ok\"]'"
fi
check "--json names the sysfs root" "echo \"\$out\" | grep -q '\"sysfs_root\":\"$dir/sys\"'"

out=$(timeout 20 "$probe" --backend bogus 2>&1); rc=$?
check "unknown backend exits 1" "[ $rc -eq 1 ]"
check "unknown backend says so" "echo \"\$out\" | grep -q 'CONNEX_BACKEND=bogus not understood'"

out=$(CONNEX_GDR=1 timeout 20 "$probe" --sysfs /nonexistent 2>&1); rc=$?
check "CONNEX_GDR=1 without a GPU exits 1" "[ $rc -eq 1 ]"
check "CONNEX_GDR=1 says why" "echo \"\$out\" | grep -q 'CONNEX_GDR=1 but GPUDirect cannot work: no GPU'"

out=$(CONNEX_FI_POLL_US=250 timeout 20 "$probe" --config); rc=$?
check "--config exits 0 with good values" "[ $rc -eq 0 ]"
check "--config lists every variable, CONNEX_LOG first" "echo \"\$out\" | head -1 | grep -q '^CONNEX_LOG  *warn  *default '"
check "--config says a value came from the environment" "echo \"\$out\" | grep -q '^CONNEX_FI_POLL_US  *250  *environment '"
out=$(CONNEX_STAGE_SLOTS=0 CONNEX_AUTH_TOKEN=hush timeout 20 "$probe" --config); rc=$?
check "--config exits 1 with a bad value" "[ $rc -eq 1 ]"
check "--config marks the bad value" "echo \"\$out\" | grep -q '^CONNEX_STAGE_SLOTS  *0  *BAD '"
check "--config never shows the token" "! echo \"\$out\" | grep -q hush"

out=$(timeout 20 "$probe" --plan); rc=$?
check "--plan exits 0" "[ $rc -eq 0 ]"
check "--plan starts with the plan" "echo \"\$out\" | head -1 | grep -q '^plan:'"
check "--plan says what CUDA memory does per backend" "echo \"\$out\" | grep -q 'cuda memory: '"
out=$(timeout 20 "$probe" --json); rc=$?
check "--json carries the plan" "echo \"\$out\" | grep -q '\"plan\":\[{\"backend\":'"

timeout 20 "$probe" --frobnicate >/dev/null 2>&1; rc=$?
check "unknown argument exits 2" "[ $rc -eq 2 ]"

out=$(timeout 20 "$probe" --pair zmq//0x1); rc=$?
if echo "$out" | grep -q ' zmq '; then
    check "--pair with a zmq-only peer picks zmq" "echo \"\$out\" | grep -q '^pair (other host): zmq'"
fi
out=$(timeout 20 "$probe" --pair nonsense 2>&1); rc=$?
check "--pair with a malformed advertisement exits 2" "[ $rc -eq 2 ]"

[ $fails -eq 0 ]
