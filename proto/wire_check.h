/* A check of a protobuf message's strings before protobuf-c unpacks it (DESIGN 5).
 *
 * protobuf-c keeps every byte of a string field but hands it out as a NUL-terminated C string,
 * so a job id "x\0y" reads as "x" after unpacking, and it never checks that a string is UTF-8
 * as proto3 requires. Whoever unpacks a message from the network calls this first, on the bytes
 * and the message's descriptor. */
#ifndef PRISM_PROTO_WIRE_CHECK_H
#define PRISM_PROTO_WIRE_CHECK_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* True when every string field of the message in data, in submessages too, is valid UTF-8
 * without a NUL byte. Otherwise false, with the field's path ("hello.job_id",
 * "step_report.blocks.name") written into path (always terminated when path_len > 0). Bytes
 * that are not a well-formed message are left to the unpacker to refuse: this returns true for
 * them, so it never refuses what unpacking would accept for another reason. */
bool prism_proto_strings_ok(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len, char *path,
                            size_t path_len);

#endif
