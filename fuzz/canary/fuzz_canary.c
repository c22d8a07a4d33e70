/*
 * fuzz/canary/fuzz_canary.c -- the negative canary of the fuzz gates: a
 * target with a planted out-of-bounds read, built only for `make
 * fuzz-canary` (fuzz/fuzz.mk).  It is not in FUZZ_TARGETS, not built by
 * fuzz/build.sh (OSS-Fuzz, ClusterFuzzLite), not installed, and links
 * nothing of the library.
 *
 * The input is a small tag-length-value container, in the style of the
 * records keyshift itself reads: "KSR" || version || records, each record
 * type (1 byte) || len (1 byte) || payload[len].  Version 1 records are
 * checked correctly.  Version 2 records end with a checksum byte that is
 * counted in len, and that path's bounds check is off by one: a record
 * whose len is exactly one more than the bytes left reads one byte past
 * the end of the input.  Reaching it takes the magic (a memcmp, which
 * libFuzzer's comparison tracing solves), the version byte and one exact
 * length: seconds, not a 2^32 guess.  If the gate's fuzzer stops finding
 * it within its time, the fuzzing setup is broken (instrumentation,
 * sanitizers, engine options), and the gate fails.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Sum of the bytes of a record's payload, the way a checksum is checked. */
static uint8_t payload_sum(const uint8_t *p, size_t n)
{
    uint8_t s = 0;
    for (size_t i = 0; i < n; i++) {
        s = (uint8_t)(s + p[i]);
    }
    return s;
}

/* Walk the records of one container; returns how many were well formed. */
static int walk(const uint8_t *data, size_t size)
{
    if (size < 4 || memcmp(data, "KSR", 3) != 0) {
        return 0;
    }
    uint8_t version = data[3];
    if (version != 1 && version != 2) {
        return 0;
    }
    size_t pos = 4;
    int good = 0;
    while (size - pos >= 2) {
        uint8_t type = data[pos];
        size_t len = data[pos + 1];
        pos += 2;
        size_t rest = size - pos;
        if (version == 1) {
            if (len > rest) {
                return good;
            }
            good += type != 0;
        } else {
            /* PLANTED BUG: must be len > rest (or len == 0). */
            if (len == 0 || len > rest + 1) {
                return good;
            }
            good += payload_sum(data + pos, len - 1) == data[pos + len - 1];
        }
        pos += len < rest ? len : rest;
    }
    return good;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    volatile int good = walk(data, size);
    (void)good;
    return 0;
}
