/* The log of Prism's daemons (prismd, prism-agent): one logfmt line per event on stderr,
 *   ts=2026-11-22T10:00:00.123Z level=info msg="listening" http=127.0.0.1:8080
 * Each line is written with one call, so lines from different threads never interleave. */
#ifndef PRISM_LOG_H
#define PRISM_LOG_H

typedef enum prism_log_level {
    PRISM_LOG_DEBUG = 0,
    PRISM_LOG_INFO = 1,
    PRISM_LOG_WARN = 2,
    PRISM_LOG_ERROR = 3
} prism_log_level;

#define PRISM_LOG_LEVELS 4

extern const char *const prism_log_level_names[PRISM_LOG_LEVELS];

/* Set once by main before any thread starts; read-only afterwards. */
extern prism_log_level prism_log_threshold;

/* Ends the key/value list of prism_log (a typed null pointer, as va_arg reads one). */
#define LOG_END ((const char *)NULL)

/* Logs one event: msg, then key/value string pairs terminated by LOG_END. */
void prism_log(prism_log_level level, const char *msg, ...) __attribute__((sentinel));

#endif
