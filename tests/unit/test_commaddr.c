/* The workers' listen address chosen by loom-agent (agent/commaddr.c): a
 * table of (comm-iface override, comm-host override, the agent's local
 * address towards loomd) -> (result, address, interface, source). Uses the
 * loopback interface "lo", which every Linux network namespace has; the
 * non-loopback path on real interfaces is covered by tests/cluster/
 * (nodes advertise 10.77.0.x on eth0). */
#include "agent/commaddr.h"

#include "tests/check.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *iface, *host, *local;
    int rc;
    const char *addr, *ifname, *why;
} cases[] = {
    /* loomd reached over loopback: nothing advertised, workers keep their default */
    {NULL, NULL, "127.0.0.1", 0, "", "", "loopback"},
    {NULL, NULL, "127.0.1.1", 0, "", "", "loopback"},
    {NULL, NULL, "::1", 0, "", "", "loopback"},
    {NULL, NULL, "", 0, "", "", "loopback"},
    {NULL, NULL, NULL, 0, "", "", "loopback"},
    /* the connection's address; an address no interface of this host holds
     * (TEST-NET-1) keeps no interface name */
    {NULL, NULL, "192.0.2.77", 0, "192.0.2.77", "", "connection"},
    /* overrides: the interface wins over the host, as in the worker */
    {"lo", NULL, "192.0.2.77", 0, "127.0.0.1", "lo", "comm-iface"},
    {"lo", "198.51.100.3", "192.0.2.77", 0, "127.0.0.1", "lo", "comm-iface"},
    {NULL, "127.0.0.1", "192.0.2.77", 0, "127.0.0.1", "lo", "comm-host"},
    {NULL, "node7.example", "192.0.2.77", 0, "node7.example", "", "comm-host"},
    {"", "", "192.0.2.77", 0, "192.0.2.77", "", "connection"},
    /* an interface that does not exist is an error naming it */
    {"nosuch9", NULL, "192.0.2.77", -1, NULL, NULL, "comm-iface"},
};

int main(void) {
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct comm_addr a;
        char err[256] = "";
        int rc =
            commaddr_choose(cases[i].iface, cases[i].host, cases[i].local, &a, err, sizeof err);
        CHECK(rc == cases[i].rc, "case %zu: rc %d, want %d (%s)", i, rc, cases[i].rc, err);
        CHECK_STR(a.why, cases[i].why);
        if (rc != 0) {
            CHECK(strstr(err, cases[i].iface) != NULL, "case %zu: message '%s' names no iface", i,
                  err);
            continue;
        }
        CHECK_STR(a.addr, cases[i].addr);
        CHECK_STR(a.iface, cases[i].ifname);
    }
    char buf[64];
    CHECK_EQ_INT(commaddr_iface_of("127.0.0.1", buf, sizeof buf), 0);
    CHECK_STR(buf, "lo");
    CHECK_EQ_INT(commaddr_iface_of("192.0.2.77", buf, sizeof buf), -1);
    CHECK_EQ_INT(commaddr_iface_of("not an address", buf, sizeof buf), -1);
    CHECK_EQ_INT(commaddr_addr_of("lo", buf, sizeof buf), 0);
    CHECK_STR(buf, "127.0.0.1");
    CHECK_EQ_INT(commaddr_addr_of("nosuch9", buf, sizeof buf), -1);
    return check_summary("test_commaddr");
}
