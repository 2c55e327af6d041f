/* The address workers listen on: see commaddr.h. */
#define _GNU_SOURCE
#include "agent/commaddr.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

static int numeric(const struct sockaddr *sa, char *out, size_t len) {
    const void *p = sa->sa_family == AF_INET
                        ? (const void *)&((const struct sockaddr_in *)sa)->sin_addr
                        : (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr;
    return inet_ntop(sa->sa_family, p, out, (socklen_t)len) ? 0 : -1;
}

/* Compares in binary form, so "::ffff:10.0.0.1" style spellings and
 * leading zeros do not matter. */
static int same_addr(const struct sockaddr *sa, const char *addr) {
    unsigned char want[sizeof(struct in6_addr)];
    if (sa->sa_family == AF_INET && inet_pton(AF_INET, addr, want) == 1)
        return !memcmp(&((const struct sockaddr_in *)sa)->sin_addr, want, 4);
    if (sa->sa_family == AF_INET6 && inet_pton(AF_INET6, addr, want) == 1)
        return !memcmp(&((const struct sockaddr_in6 *)sa)->sin6_addr, want, 16);
    return 0;
}

int commaddr_iface_of(const char *addr, char *iface, size_t len) {
    struct ifaddrs *ifs = NULL;
    int rc = -1;
    if (!addr || !*addr || getifaddrs(&ifs) != 0) return -1;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || !same_addr(i->ifa_addr, addr)) continue;
        snprintf(iface, len, "%s", i->ifa_name);
        rc = 0;
        break;
    }
    freeifaddrs(ifs);
    return rc;
}

int commaddr_addr_of(const char *iface, char *addr, size_t len) {
    struct ifaddrs *ifs = NULL;
    int rc = -1;
    if (!iface || !*iface || getifaddrs(&ifs) != 0) return -1;
    for (int fam = 0; fam < 2 && rc != 0; fam++) {
        for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
            if (!i->ifa_addr || strcmp(i->ifa_name, iface) ||
                i->ifa_addr->sa_family != (fam == 0 ? AF_INET : AF_INET6))
                continue;
            if (numeric(i->ifa_addr, addr, len) == 0) {
                rc = 0;
                break;
            }
        }
    }
    freeifaddrs(ifs);
    return rc;
}

static int is_loopback(const char *addr) {
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, addr, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, addr, &a6) == 1) return IN6_IS_ADDR_LOOPBACK(&a6);
    return 0;
}

int commaddr_choose(const char *comm_iface, const char *comm_host, const char *local_ip,
                    struct comm_addr *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (comm_iface && *comm_iface) {
        out->why = "comm-iface";
        snprintf(out->iface, sizeof out->iface, "%s", comm_iface);
        if (commaddr_addr_of(comm_iface, out->addr, sizeof out->addr) != 0) {
            snprintf(err, errlen, "comm-iface %s: no such interface, or it has no address",
                     comm_iface);
            return -1;
        }
        return 0;
    }
    if (comm_host && *comm_host) {
        /* A name is passed on as given (the worker resolves it); the
         * interface is known only for a numeric address of this host. */
        out->why = "comm-host";
        snprintf(out->addr, sizeof out->addr, "%s", comm_host);
        if (commaddr_iface_of(comm_host, out->iface, sizeof out->iface) != 0) out->iface[0] = 0;
        return 0;
    }
    if (!local_ip || !*local_ip || is_loopback(local_ip)) {
        out->why = "loopback";
        return 0;
    }
    out->why = "connection";
    snprintf(out->addr, sizeof out->addr, "%s", local_ip);
    if (commaddr_iface_of(local_ip, out->iface, sizeof out->iface) != 0) out->iface[0] = 0;
    return 0;
}
