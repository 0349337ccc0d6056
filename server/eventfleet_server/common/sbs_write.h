/* Writing SBS (hat-sbs 0.7) Integers: what the replica's C extensions that build wire
 * bytes share (chatter/_frame.c, eventer/_register.c). The layout of
 * common/sbsint.py's `encode_int`.
 *
 * Include after <Python.h> and <stdint.h>. */
#ifndef EVENTFLEET_SBS_WRITE_H
#define EVENTFLEET_SBS_WRITE_H

/* The most bytes a non-negative 64-bit Integer takes: ten 7-bit groups. */
#define SBS_INT_MAX_BYTES 10

/* Writes the encoding of the non-negative `v` at `out` (room for SBS_INT_MAX_BYTES);
 * returns its length: big-endian 7-bit groups, the last byte marked with 0x80, a zero
 * group in front when the first would carry the sign bit (0x40). */
static inline int
put_uint(unsigned char *out, uint64_t v)
{
    unsigned char groups[SBS_INT_MAX_BYTES];
    int n = 0;
    do {
        groups[n++] = v & 0x7F;
        v >>= 7;
    } while (v);
    if (groups[n - 1] & 0x40)
        groups[n++] = 0;
    for (int i = 0; i < n; i++)
        out[i] = groups[n - 1 - i];
    out[n - 1] |= 0x80;
    return n;
}

/* A non-negative int64 from an exact int, or -1 (no error left set) for anything else:
 * the caller then leaves the value to its Python code. */
static inline int64_t
nonneg_int64(PyObject *o)
{
    if (!PyLong_CheckExact(o))
        return -1;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    if (overflow || v < 0)
        return -1;
    return v;
}

#endif /* EVENTFLEET_SBS_WRITE_H */
