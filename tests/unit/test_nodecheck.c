/* Unit test of the node-check expectation table (daemon/nodecheck.c): the
 * figure a check is judged against, by check kind, device kind,
 * interconnect and GPU model (first match wins). */
#include "daemon/nodecheck.h"

#include <math.h>
#include <stdio.h>

int main(void) {
    static const struct {
        const char *check, *device, *ic, *model;
        double want;
    } cases[] = {
        {"node", "cuda", "nvlink", "NVIDIA H100 80GB HBM3", 360},
        {"node", "cuda", "NVLink", "NVIDIA H200", 360},
        {"node", "cuda", "nvlink", "NVIDIA A100-SXM4-80GB", 200},
        {"node", "cuda", "nvlink", "NVIDIA B200", 650},
        {"node", "cuda", "nvlink", "NVIDIA L40S", 150},
        {"node", "cuda", "pcie", "NVIDIA H100 PCIe", 12},
        {"node", "cuda", NULL, NULL, 10},
        {"node", "cuda", "unknown", "NVIDIA H100", 10},
        {"pair", "cuda", "nvlink", "NVIDIA H100", 10},
        {"node", "cpu", NULL, "cpu", 0.01},
        {"pair", "cpu", "none", NULL, 0.01},
    };
    int failures = 0;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        double got =
            nodecheck_expected_gbps(cases[i].check, cases[i].device, cases[i].ic, cases[i].model);
        if (fabs(got - cases[i].want) > 1e-9) {
            fprintf(stderr, "case %zu (%s %s %s %s): %g, want %g\n", i, cases[i].check,
                    cases[i].device, cases[i].ic ? cases[i].ic : "-",
                    cases[i].model ? cases[i].model : "-", got, cases[i].want);
            failures++;
        }
    }
    if (!failures) printf("test_nodecheck: ok (%zu cases)\n", sizeof cases / sizeof *cases);
    return failures ? 1 : 0;
}
