/* A strict checker of the Prometheus text exposition format (0.0.4), for the tests: every line a
 * HELP, a TYPE or a sample; names and label names well formed; label values quoted with only the
 * three escapes; values numbers; a TYPE before its family's samples and once; a family's samples
 * contiguous; no series twice; histograms with cumulative buckets ending in +Inf equal to _count.
 * prom_check returns NULL or what is wrong, with the line. prom_value looks one series up. */
#ifndef PROM_CHECK_H
#define PROM_CHECK_H

#include <stddef.h>

const char *prom_check(const char *text, char *err, size_t errlen);
/* The value of the sample whose name and labels text is exactly `series` (`name{a="b",c="d"}`
 * or a bare name). 0 and *v, or -1 when absent. */
int prom_value(const char *text, const char *series, double *v);
/* The sum over the samples named `name` whose labels include the label text `with` (NULL: all). */
double prom_sum(const char *text, const char *name, const char *with);

#endif
