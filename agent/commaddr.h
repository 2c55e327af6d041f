/* The address a node's workers listen on for worker-to-worker traffic (Gloo's
 * TCP pairs, NCCL's sockets) and the interface that carries it.
 *
 * By default it is the local address of the agent's connection to loomd (the
 * getsockname() of that socket, through api/client.h): the interface through
 * which this host reaches the coordinator reaches the other nodes too on a
 * flat cluster network. The agent's rows comm-iface / comm-host (env
 * LOOM_COMM_IFACE / LOOM_COMM_HOST, the same names the worker reads) override
 * it for a node whose data network is another NIC. The agent advertises the
 * choice at registration and hands it to every worker it starts (agent/task.c).
 * Pure functions of their inputs plus getifaddrs(); any thread. */
#ifndef LOOM_AGENT_COMMADDR_H
#define LOOM_AGENT_COMMADDR_H

#include <stddef.h>

struct comm_addr {
    char addr[64];   /* numeric address; "" when none is chosen (loopback only) */
    char iface[32];  /* interface holding addr; "" when unknown */
    const char *why; /* "connection", "comm-iface", "comm-host" or "loopback" (static) */
};

/* The interface that holds the numeric address `addr` (IPv4 or IPv6).
 * Returns 0 and writes its name, or -1 when no interface has it. */
int commaddr_iface_of(const char *addr, char *iface, size_t len);

/* The first IPv4 address of interface `iface` (else its first IPv6 one).
 * Returns 0 and writes it, or -1 when the interface has no address. */
int commaddr_addr_of(const char *iface, char *addr, size_t len);

/* Decides the advertised address. comm_iface / comm_host: the overrides (NULL
 * or "" when unset; the interface wins when both are set, as in the worker);
 * local_ip: the agent's side of its connection to loomd. A loopback local
 * address (loomd on this host, reached as 127.0.0.1) chooses nothing: workers
 * then keep their own default, which serves one host. Returns 0, or -1 with a
 * message in err when comm_iface names an interface without an address. */
int commaddr_choose(const char *comm_iface, const char *comm_host, const char *local_ip,
                    struct comm_addr *out, char *err, size_t errlen);

#endif
