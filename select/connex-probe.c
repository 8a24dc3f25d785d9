/* connex-probe: what this host has, which backends an engine would open, and why.
 * Exit status: 0 a usable backend exists, 1 none (or a forced one cannot run), 2 usage. */
#include "cx_select.h"
#include "connex/connex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: connex-probe [--json|--plan] [--backend auto|ucx|libfabric|zmq] [--sysfs DIR]\n"
            "                    [--net-devices LIST] [--gdr auto|0|1] [--pair ADV,ADV,...]\n"
            "  Probes RDMA devices, libfabric, UCX, CUDA and the built backends, then prints the\n"
            "  backends an engine would open (best first), GPUDirect, the NIC per GPU, and why.\n"
            "  --backend, --net-devices, --gdr default to CONNEX_BACKEND, CONNEX_NET_DEVICES and\n"
            "  CONNEX_GDR. --sysfs reads a synthetic sysfs tree instead of /sys.\n"
            "  --plan: only the plan, what each backend's open is given (provider, domain, devices,\n"
            "  GPUDirect per memory kind and what it rests on); --json has it under decision.plan.\n"
            "  --pair ADV,...: also show which backend this host would use with a peer that\n"
            "  advertised ADV (backend/variant/0xcaps, as printed under 'advertised'); text mode only.\n"
            "usage: connex-probe --config\n"
            "  Prints every CONNEX_* variable: its effective value, where it came from (default,\n"
            "  environment, or BAD: a value cx_engine_create refuses), the component that reads it,\n"
            "  what it does and the values allowed. Exit status 1 when a value is bad.\n");
}

static int config(void)
{
    size_t need = cx_options_report(NULL, 0);
    char *out = malloc(need + 1);
    if (!out) {
        fprintf(stderr, "connex-probe: out of memory\n");
        return 1;
    }
    cx_options_report(out, need + 1);
    fputs(out, stdout);
    int bad = strstr(out, " BAD ") != NULL;
    free(out);
    return bad;
}

int main(int argc, char **argv)
{
    int json = 0, plan = 0;
    const char *sysfs = NULL, *pair = NULL;
    cx_select_opts_t o;
    cx_select_opts_from_env(&o, NULL);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--config")) return config();
        if (!strcmp(a, "--json"))
            json = 1;
        else if (!strcmp(a, "--plan"))
            plan = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (v && !strcmp(a, "--backend")) {
            o.backend = v;
            i++;
        } else if (v && !strcmp(a, "--sysfs")) {
            sysfs = v;
            i++;
        } else if (v && !strcmp(a, "--net-devices")) {
            o.net_devices = v;
            i++;
        } else if (v && !strcmp(a, "--gdr")) {
            o.gdr = v;
            i++;
        } else if (v && !strcmp(a, "--pair")) {
            pair = v;
            i++;
        } else {
            fprintf(stderr, "connex-probe: unknown or incomplete argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    cx_probe_t *p = calloc(1, sizeof *p);
    cx_decision_t *d = calloc(1, sizeof *d);
    if (!p || !d) {
        fprintf(stderr, "connex-probe: out of memory\n");
        free(p);
        free(d);
        return 1;
    }
    cx_probe_host(p, sysfs);
    int rc = cx_select_decide_opts(p, &o, d);

    size_t need = json ? cx_select_report_json(p, d, rc, NULL, 0)
        : plan         ? cx_select_report_plan(p, d, rc, NULL, 0)
                       : cx_select_report_text(p, d, rc, NULL, 0);
    char *out = malloc(need + 1);
    if (!out) {
        fprintf(stderr, "connex-probe: out of memory\n");
        free(p);
        free(d);
        return 1;
    }
    if (json)
        cx_select_report_json(p, d, rc, out, need + 1);
    else if (plan)
        cx_select_report_plan(p, d, rc, out, need + 1);
    else
        cx_select_report_text(p, d, rc, out, need + 1);
    fputs(out, stdout);
    free(out);

    if (!json && rc == CX_OK) {
        printf("advertised:");
        for (int i = 0; i < d->n; i++) {
            char adv[96];
            if (!cx_choice_format(&d->be[i], adv, sizeof adv)) printf(" %s", adv);
        }
        printf("\n");
    }
    if (pair && rc == CX_OK && !json) {
        cx_choice_t theirs[CX_SEL_MAX_BE];
        int n = 0;
        char buf[512];
        snprintf(buf, sizeof buf, "%s", pair);
        char *save = NULL;
        for (char *t = strtok_r(buf, ",", &save); t && n < CX_SEL_MAX_BE; t = strtok_r(NULL, ",", &save)) {
            if (cx_choice_parse(t, &theirs[n])) {
                fprintf(stderr, "connex-probe: --pair: '%s' is not backend/variant/0xcaps\n", t);
                free(p);
                free(d);
                return 2;
            }
            n++;
        }
        int order[CX_SEL_MAX_BE];
        char why[512];
        int k = cx_select_pair(d->be, d->n, theirs, n, 0, order, why, sizeof why);
        printf("pair (other host): %s\n", k ? d->be[order[0]].backend : "no common backend");
        printf("  order: %s\n", why);
    }
    free(p);
    free(d);
    return rc == CX_OK ? 0 : 1;
}
