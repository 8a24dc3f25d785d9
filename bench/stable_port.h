/* A listening port for a process that is killed and restarted under the same identity and port
 * (the demo, the failover and soak benchmarks, the tests' restartable peers). Depends on libc only,
 * so the tests' harness compiles it too. */
#ifndef CX_BENCH_STABLE_PORT_H
#define CX_BENCH_STABLE_PORT_H

#include <stdint.h>

/* A TCP port, free on `ip` right now, that lies outside the kernel's ephemeral range
 * (net.ipv4.ip_local_port_range). A port the kernel handed out through bind(port 0) is ephemeral:
 * while its process is down, any connect() or bind(port 0) on the host may be given it, and the
 * restart then fails with EADDRINUSE. A port outside that range can only be taken by an explicit
 * bind. ip: numeric IPv4 or IPv6 (NULL: 127.0.0.1). Returns 0 when none was found: the caller
 * then falls back to an ephemeral port. */
uint16_t cx_bench_stable_port(const char *ip);

#endif
