/* loomd: the Loom coordinator. Loads the config table, starts the context,
 * then waits in the main thread for SIGTERM/SIGINT and stops gracefully
 * (in-flight requests finish, the store closes cleanly). */
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <string.h>

#include "api/client.h"
#include "common/log.h"
#include "daemon/loomd.h"

int main(int argc, char **argv) {
    struct loomd ld;
    memset(&ld, 0, sizeof ld);
    int rc = loomd_config_load(&ld, argc, argv);
    if (rc != 0) {
        config_free(loomd_config_table, loomd_config_count, &ld.cfg);
        return rc > 0 ? 0 : 2;
    }
    /* Block the stop signals before any thread starts so that only sigwait
     * below receives them; ignore SIGPIPE (clients that hang up). */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* libcurl (webhook deliveries) is initialised once, before any thread. */
    client_global_init();
    /* One descriptor per connection (and per SQLite connection): raise the
     * soft limit to the hard one so --conn-limit is reachable. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (loomd_start(&ld) != 0) {
        log_error("loomd: start-up failed");
        loomd_stop(&ld);
        return 1;
    }
    int sig = 0;
    sigwait(&set, &sig);
    log_info("loomd: %s received, shutting down", sig == SIGTERM ? "SIGTERM" : "SIGINT");
    loomd_stop(&ld);
    log_info("loomd: stopped cleanly");
    return 0;
}
