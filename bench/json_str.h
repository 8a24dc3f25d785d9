/* One JSON string writer for the programs that print JSON (connex-bench --json, connex-ctl
 * --json): a static library both link (cx_json_str). */
#ifndef CX_JSON_STR_H
#define CX_JSON_STR_H

#include <stdio.h>

/* s as a JSON string on f: quoted, with quotes, backslashes and control characters escaped.
 * NULL prints null. */
void cx_json_str(FILE *f, const char *s);

#endif
