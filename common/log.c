#define _GNU_SOURCE
#include "log.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

const char *const prism_log_level_names[PRISM_LOG_LEVELS] = {"debug", "info", "warn", "error"};

prism_log_level prism_log_threshold = PRISM_LOG_INFO;

typedef struct log_line {
    char buf[4096];
    size_t len; /* always < sizeof buf - 1: room is kept for the final newline */
} log_line;

static void log_putc(log_line *l, char c)
{
    if (l->len + 2 < sizeof l->buf)
        l->buf[l->len++] = c;
}

static void log_puts(log_line *l, const char *s)
{
    while (*s)
        log_putc(l, *s++);
}

static bool logfmt_needs_quotes(const char *s)
{
    if (!*s)
        return true;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p <= ' ' || *p == '"' || *p == '=' || *p == '\\' || *p >= 0x7f)
            return true;
    }
    return false;
}

/* Writes s as a logfmt value: bare when it is one plain ASCII token, else quoted with \" \\ \n
 * \t \r, \u00XX for control bytes and \xXX for bytes past ASCII, so that a request path or an
 * error text can never break the line or make it invalid UTF-8. */
static void log_put_value(log_line *l, const char *s, bool always_quote)
{
    if (!always_quote && !logfmt_needs_quotes(s)) {
        log_puts(l, s);
        return;
    }
    log_putc(l, '"');
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': log_puts(l, "\\\""); break;
        case '\\': log_puts(l, "\\\\"); break;
        case '\n': log_puts(l, "\\n"); break;
        case '\t': log_puts(l, "\\t"); break;
        case '\r': log_puts(l, "\\r"); break;
        default:
            if (*p < ' ' || *p >= 0x7f) { /* control bytes, and bytes a client may send that are not ASCII */
                char esc[8];
                if (*p < 0x80)
                    snprintf(esc, sizeof esc, "\\u%04x", (unsigned)*p);
                else
                    snprintf(esc, sizeof esc, "\\x%02x", (unsigned)*p);
                log_puts(l, esc);
            } else {
                log_putc(l, (char)*p);
            }
        }
    }
    log_putc(l, '"');
}



void prism_log(prism_log_level level, const char *msg, ...)
{
    if (level < prism_log_threshold)
        return;
    log_line l = {.len = 0};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char stamp[64];
    strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
    char millis[24];
    snprintf(millis, sizeof millis, ".%03dZ", (int)(ts.tv_nsec / 1000000L));
    log_puts(&l, "ts=");
    log_puts(&l, stamp);
    log_puts(&l, millis);
    log_puts(&l, " level=");
    log_puts(&l, prism_log_level_names[level]);
    log_puts(&l, " msg=");
    log_put_value(&l, msg, true);

    va_list ap;
    va_start(ap, msg);
    for (const char *key = va_arg(ap, const char *); key; key = va_arg(ap, const char *)) {
        const char *value = va_arg(ap, const char *);
        log_putc(&l, ' ');
        log_puts(&l, key);
        log_putc(&l, '=');
        log_put_value(&l, value ? value : "", false);
    }
    va_end(ap);
    l.buf[l.len++] = '\n';
    fwrite(l.buf, 1, l.len, stderr);
    fflush(stderr);
}

