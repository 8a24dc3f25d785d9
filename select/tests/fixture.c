/* Materialises a fixture layout as a sysfs-shaped tree (see fixture.h). */
#define _XOPEN_SOURCE 700
#include "fixture.h"

#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int mkdirs(const char *path)
{
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *s = tmp + 1; *s; s++) {
        if (*s != '/') continue;
        *s = 0;
        if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
        *s = '/';
    }
    return (mkdir(tmp, 0755) && errno != EEXIST) ? -1 : 0;
}

static int put(const char *dir, const char *rel, const char *text)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, rel) >= (int)sizeof path) return -1;
    char *slash = strrchr(path, '/');
    *slash = 0;
    if (mkdirs(path)) return -1;
    *slash = '/';
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "%s\n", text);
    return fclose(f);
}

static int link_to(const char *target, const char *dir, const char *rel)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s/%s", dir, rel) >= (int)sizeof path) return -1;
    char *slash = strrchr(path, '/');
    *slash = 0;
    if (mkdirs(path)) return -1;
    *slash = '/';
    unlink(path);
    return symlink(target, path);
}

static const char *opt(char **tok, int n, const char *key)
{
    size_t k = strlen(key);
    for (int i = 0; i < n; i++)
        if (!strncmp(tok[i], key, k) && tok[i][k] == '=') return tok[i] + k + 1;
    return NULL;
}

/* The device directory, its attributes and its /sys/bus/pci/devices link. */
static int pci_dev(const char *dir, const char *path, const char *vendor, const char *cls, const char *numa,
                   char *devdir, size_t len)
{
    snprintf(devdir, len, "%s/devices/%s", dir, path);
    if (mkdirs(devdir)) return -1;
    char rel[PATH_MAX];
    const char *bdf = strrchr(path, '/');
    bdf = bdf ? bdf + 1 : path;
    snprintf(rel, sizeof rel, "devices/%s/vendor", path);
    if (put(dir, rel, vendor)) return -1;
    snprintf(rel, sizeof rel, "devices/%s/class", path);
    if (put(dir, rel, cls)) return -1;
    snprintf(rel, sizeof rel, "devices/%s/numa_node", path);
    if (put(dir, rel, numa ? numa : "-1")) return -1;
    snprintf(rel, sizeof rel, "bus/pci/devices/%s", bdf);
    return link_to(devdir, dir, rel);
}

int cx_fixture_build(const char *layout, const char *dir)
{
    FILE *f = fopen(layout, "r");
    if (!f) {
        fprintf(stderr, "fixture: cannot open %s: %s\n", layout, strerror(errno));
        return -1;
    }
    if (mkdirs(dir)) {
        fclose(f);
        return -1;
    }
    char line[1024], devdir[PATH_MAX], rel[PATH_MAX + 64], tgt[PATH_MAX];
    int lineno = 0, rc = 0;
    while (!rc && fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash) *hash = 0;
        char *tok[16];
        int n = 0;
        char *save = NULL;
        for (char *t = strtok_r(line, " \t\n", &save); t && n < 16; t = strtok_r(NULL, " \t\n", &save)) tok[n++] = t;
        if (!n) continue;
        if (!strcmp(tok[0], "gpu") && n >= 2) {
            rc = pci_dev(dir, tok[1], "0x10de", "0x030200", opt(tok, n, "numa"), devdir, sizeof devdir);
        } else if (!strcmp(tok[0], "module") && n == 2) {
            snprintf(rel, sizeof rel, "%s/module/%s", dir, tok[1]);
            rc = mkdirs(rel);
        } else if (!strcmp(tok[0], "nic") && n >= 4) {
            const char *drv = opt(tok, n, "driver");
            const char *ven = opt(tok, n, "vendor");
            if (!ven) ven = (drv && !strcmp(drv, "efa")) ? "0x1d0f" : "0x15b3";
            rc = pci_dev(dir, tok[2], ven, "0x020000", opt(tok, n, "numa"), devdir, sizeof devdir);
            if (!rc && drv) {
                snprintf(tgt, sizeof tgt, "%s/bus/pci/drivers/%s", dir, drv);
                rc = mkdirs(tgt);
                snprintf(rel, sizeof rel, "devices/%s/driver", tok[2]);
                if (!rc) rc = link_to(tgt, dir, rel);
            }
            snprintf(rel, sizeof rel, "class/infiniband/%s/device", tok[1]);
            if (!rc) rc = link_to(devdir, dir, rel);
            for (int i = 3; !rc && i < n; i++) {
                if (strncmp(tok[i], "port=", 5)) continue;
                char spec[64];
                snprintf(spec, sizeof spec, "%s", tok[i] + 5);
                char *st = strchr(spec, ':'), *ll = st ? strchr(st + 1, ':') : NULL;
                if (!st || !ll) {
                    rc = -1;
                    break;
                }
                *st++ = 0;
                *ll++ = 0;
                snprintf(rel, sizeof rel, "class/infiniband/%s/ports/%s/state", tok[1], spec);
                rc = put(dir, rel, !strcmp(st, "ACTIVE") ? "4: ACTIVE" : "1: DOWN");
                snprintf(rel, sizeof rel, "class/infiniband/%s/ports/%s/link_layer", tok[1], spec);
                if (!rc) rc = put(dir, rel, ll);
            }
        } else {
            rc = -1;
        }
        if (rc) fprintf(stderr, "fixture: %s:%d: bad line or write failed\n", layout, lineno);
    }
    fclose(f);
    return rc ? -1 : 0;
}

/* The directory for scratch files: $TMPDIR, else the system's (P_tmpdir). */
static const char *tmp_base(void)
{
    const char *t = getenv("TMPDIR");
    return t && *t ? t : P_tmpdir;
}

int cx_fixture_make(const char *layout, char *out, size_t len)
{
    char tmpl[512];
    snprintf(tmpl, sizeof tmpl, "%s/cx-sysfs-XXXXXX", tmp_base());
    if (!mkdtemp(tmpl)) return -1;
    snprintf(out, len, "%s", tmpl);
    if (cx_fixture_build(layout, tmpl)) {
        cx_fixture_remove(tmpl);
        return -1;
    }
    return 0;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int cx_fixture_remove(const char *dir)
{
    char own[512]; /* never anything but our own */
    int n = snprintf(own, sizeof own, "%s/cx-sysfs-", tmp_base());
    if (n <= 0 || strncmp(dir, own, (size_t)n)) return -1;
    return nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}
