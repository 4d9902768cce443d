/* Socket addresses as Prism's daemons take them on the command line. */
#define _GNU_SOURCE
#include "net.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

static bool parse_port(const char *s, uint16_t *port)
{
    size_t n = strlen(s);
    if (n == 0 || n > 5)
        return false;
    unsigned long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (unsigned long)(s[i] - '0');
    }
    if (v < 1 || v > 65535)
        return false;
    *port = (uint16_t)v;
    return true;
}

prism_status prism_parse_listen(const char *value, struct sockaddr_storage *addr, socklen_t *addr_len, char *text,
                                size_t text_len, prism_error *err)
{
    char host[INET6_ADDRSTRLEN + 1];
    const char *port_text = NULL;
    int family;
    if (value[0] == '[') {
        const char *close = strchr(value, ']');
        if (!close || close[1] != ':' || (size_t)(close - value - 1) >= sizeof host)
            goto bad;
        memcpy(host, value + 1, (size_t)(close - value - 1));
        host[close - value - 1] = '\0';
        port_text = close + 2;
        family = AF_INET6;
    } else {
        const char *colon = strrchr(value, ':');
        if (!colon || (size_t)(colon - value) >= sizeof host)
            goto bad;
        memcpy(host, value, (size_t)(colon - value));
        host[colon - value] = '\0';
        port_text = colon + 1;
        family = AF_INET;
    }
    uint16_t port;
    if (!parse_port(port_text, &port))
        goto bad;

    memset(addr, 0, sizeof *addr);
    char canonical[INET6_ADDRSTRLEN];
    if (family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)addr;
        sin->sin_family = AF_INET;
        sin->sin_port = htons(port);
        if (inet_pton(AF_INET, host, &sin->sin_addr) != 1)
            goto bad;
        inet_ntop(AF_INET, &sin->sin_addr, canonical, sizeof canonical);
        *addr_len = sizeof *sin;
        snprintf(text, text_len, "%s:%u", canonical, (unsigned)port);
    } else {
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)addr;
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons(port);
        if (inet_pton(AF_INET6, host, &sin6->sin6_addr) != 1)
            goto bad;
        inet_ntop(AF_INET6, &sin6->sin6_addr, canonical, sizeof canonical);
        *addr_len = sizeof *sin6;
        snprintf(text, text_len, "[%s]:%u", canonical, (unsigned)port);
    }
    return PRISM_OK;
bad:
    return prism_error_set(err, PRISM_ERR_INVALID,
                           "\"%.200s\" is not ADDR:PORT (ADDR an IPv4 address a.b.c.d or an IPv6 "
                           "address in brackets such as [::1]; PORT 1-65535)",
                           value);
}

