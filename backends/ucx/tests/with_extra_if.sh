#!/usr/bin/env bash
# Runs the command in a private network namespace that has, besides lo, an interface only this
# host could reach (one end of a veth pair, with its own subnet): UCX must keep tcp on the interface of the
# engine's control address (lo here) and never build lanes over the extra one. Skips (77) where
# network namespaces cannot be made (no root, no unshare, no veth).
set -u
if [ "${CX_IN_NETNS:-}" != 1 ]; then
  command -v unshare >/dev/null && command -v ip >/dev/null || { echo "skip: no unshare or ip"; exit 77; }
  unshare -n -m true 2>/dev/null || { echo "skip: cannot make a network namespace (root needed)"; exit 77; }
  CX_IN_NETNS=1 exec unshare -n -m "$0" "$@"
fi
# UCX lists interfaces in /sys/class/net, which shows the namespace that mounted /sys
mount -t sysfs sysfs /sys 2>/dev/null || { echo "skip: cannot mount sysfs for the namespace"; exit 77; }
ip link set lo up || exit 77
ip link add cxextra0 type veth peer name cxextra1 2>/dev/null || { echo "skip: no veth links here"; exit 77; }
ip addr add 10.251.7.1/24 dev cxextra0 && ip link set cxextra0 up && ip link set cxextra1 up || exit 1
CX_TEST_EXTRA_IF=cxextra0 exec "$@"
