/* Synthetic sysfs trees for the select/ tests, built from a small layout file (fixtures/NAME.layout):
 *   gpu    <pci path> [numa=N]
 *   nic    <ibdev> <pci path> driver=D [vendor=0xVVVV] [numa=N] port=N:ACTIVE|DOWN:InfiniBand|Ethernet|Unspecified ...
 *   module <name>
 * A pci path is the sysfs device path below the devices directory, e.g.
 * "pci0000:15/0000:15:01.0/0000:16:00.0/0000:1b:00.0". */
#ifndef CX_SEL_FIXTURE_H
#define CX_SEL_FIXTURE_H
#include <stddef.h>

/* Materialise layout into dir (created if missing). 0, or -1 with a message on stderr. */
int cx_fixture_build(const char *layout, const char *dir);
/* The same into a fresh mkdtemp directory under /tmp, its path written to out. */
int cx_fixture_make(const char *layout, char *out, size_t len);
/* rm -rf of a directory made by cx_fixture_make. */
int cx_fixture_remove(const char *dir);
#endif
