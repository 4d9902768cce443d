/* Fuzz target "agent_frames": prism-agent's local frame parser (agent/socket.c: conn_read and
 * take_frame), the bytes a trainer writes on the Unix socket. socket.c is compiled into this file,
 * so that its static reader is called as the agent calls it, on the read end of a pipe that the
 * target fills in chunks (the chunk boundaries are part of the input, as the kernel splits a
 * stream anywhere). Every frame the reader passes on must be an AgentMessage of a kind a trainer
 * sends, whole.
 *
 * Input: chunks, each a 2-byte little-endian length and that many bytes of the stream. */
#include "socket.c"

#include <fcntl.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static agent fuzz_agent;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool ready;
    if (!ready) {
        prism_log_threshold = PRISM_LOG_ERROR + 1;
        ready = true;
    }
    agent *a = &fuzz_agent;
    memset(a, 0, sizeof *a);
    agent_inbox_init(&a->inbox, 1u << 20);
    int p[2];
    FUZZ_CHECK(pipe2(p, O_CLOEXEC | O_NONBLOCK) == 0);
    conn c = {.fd = p[0], .id = 1};
    const char *bad = NULL;
    bool eof = false;
    size_t pos = 0;
    while (!bad && !eof && pos + 2 <= size) {
        size_t len = (size_t)data[pos] | (size_t)data[pos + 1] << 8;
        pos += 2;
        if (len > size - pos)
            len = size - pos;
        /* A pipe holds 64 KiB; the chunk length is at most 65535. */
        size_t done = 0;
        while (done < len) {
            ssize_t n = write(p[1], data + pos + done, len - done);
            FUZZ_CHECK(n > 0);
            done += (size_t)n;
        }
        pos += len;
        bad = conn_read(a, &c, &eof);
    }
    close(p[1]);
    if (!bad && !eof)
        bad = conn_read(a, &c, &eof);
    FUZZ_CHECK(bad || eof);
    close(p[0]);
    free(c.buf);
    /* What reached the inbox. */
    agent_frame *f = agent_inbox_take(&a->inbox);
    while (f) {
        Prism__V1__AgentMessage *m = prism__v1__agent_message__unpack(NULL, f->len, f->data);
        FUZZ_CHECK(m != NULL);
        FUZZ_CHECK((int)m->kind_case == f->kind);
        FUZZ_CHECK(m->kind_case == PRISM__V1__AGENT_MESSAGE__KIND_HELLO ||
                   m->kind_case == PRISM__V1__AGENT_MESSAGE__KIND_STEP_REPORT ||
                   m->kind_case == PRISM__V1__AGENT_MESSAGE__KIND_CALIBRATION);
        prism__v1__agent_message__free_unpacked(m, NULL);
        agent_frame *next = f->next;
        free(f);
        f = next;
    }
    agent_inbox_destroy(&a->inbox);
    return 0;
}
