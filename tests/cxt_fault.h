/* Faults on threads other than the test's (cxt_fault.c), for every cmocka program of the suite. */
#ifndef CXT_FAULT_H
#define CXT_FAULT_H

/* Whether this process's fault signals go through the harness: cmocka's handler for the test's
 * thread, a report and death by the signal for any other thread. */
int cxt_fault_installed(void);

#endif
