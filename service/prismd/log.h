/* prismd's log: one logfmt line per event on stderr,
 *   ts=2026-11-22T10:00:00.123Z level=info msg="listening" http=127.0.0.1:8080
 * Each line is written with one call, so lines from different threads never interleave. */
#ifndef PRISMD_LOG_H
#define PRISMD_LOG_H

typedef enum prismd_log_level {
    PRISMD_LOG_DEBUG = 0,
    PRISMD_LOG_INFO = 1,
    PRISMD_LOG_WARN = 2,
    PRISMD_LOG_ERROR = 3
} prismd_log_level;

#define PRISMD_LOG_LEVELS 4

extern const char *const prismd_log_level_names[PRISMD_LOG_LEVELS];

/* Set once by main before any thread starts; read-only afterwards. */
extern prismd_log_level prismd_log_threshold;

/* Ends the key/value list of prismd_log (a typed null pointer, as va_arg reads one). */
#define LOG_END ((const char *)NULL)

/* Logs one event: msg, then key/value string pairs terminated by LOG_END. */
void prismd_log(prismd_log_level level, const char *msg, ...) __attribute__((sentinel));

#endif
