/* Time units: the core keeps clocks, deadlines and windows in nanoseconds; configs and logs speak
 * milliseconds or microseconds. Named here so that every conversion reads as one. (Not "time.h":
 * core/src is on the include path and would hide <time.h>.) */
#ifndef CX_UNITS_H
#define CX_UNITS_H

#include <stdint.h>
#include <time.h>

#define CX_NS_PER_US 1000ull
#define CX_NS_PER_MS 1000000ull
#define CX_NS_PER_S 1000000000ull
#define CX_MS_PER_S 1000

static inline uint64_t cx_ms_to_ns(uint64_t ms)
{
    return ms * CX_NS_PER_MS;
}
static inline uint64_t cx_us_to_ns(uint64_t us)
{
    return us * CX_NS_PER_US;
}
static inline uint64_t cx_ns_to_ms(uint64_t ns)
{
    return ns / CX_NS_PER_MS;
}
/* Rounded up: a wait of this many ms does not end before ns have passed. */
static inline uint64_t cx_ns_to_ms_ceil(uint64_t ns)
{
    return (ns + CX_NS_PER_MS - 1) / CX_NS_PER_MS;
}

static inline uint64_t cx_timespec_ns(const struct timespec *ts)
{
    return (uint64_t)ts->tv_sec * CX_NS_PER_S + (uint64_t)ts->tv_nsec;
}

static inline struct timespec cx_ns_timespec(uint64_t ns)
{
    struct timespec ts = { (time_t)(ns / CX_NS_PER_S), (long)(ns % CX_NS_PER_S) };
    return ts;
}

#endif
