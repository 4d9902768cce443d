/* Socket addresses as Prism's daemons (prismd, prism-agent) take them on the command line. */
#ifndef PRISM_NET_H
#define PRISM_NET_H

#include "prism/common.h"

#include <sys/socket.h>

/* Parses exactly "a.b.c.d:port" or "[ipv6]:port" with a numeric address (no host names: a daemon
 * binds where it is told, it does not resolve) into *addr and its canonical text
 * ("127.0.0.1:8080", "[::1]:8080"). Anything else is PRISM_ERR_INVALID quoting the value. */
prism_status prism_parse_listen(const char *value, struct sockaddr_storage *addr, socklen_t *addr_len, char *text,
                                size_t text_len, prism_error *err);

#endif
