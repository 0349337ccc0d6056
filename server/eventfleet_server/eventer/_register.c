/* eventfleet_server.eventer._register: a one-slice MsgRegisterReq decoded in C.
 *
 * Why: for the events of a register request that fits one slice (nearly every request),
 * `wire.py`'s Python walk (`slices`), the hat-sbs C decoder (to dicts) and
 * `codec.register_event_from_sbs` cost ~4.1 us per event (1.75 + 1.66 + 0.67 in a
 * micro-benchmark of 100-event requests, docs/decisions.md). This is the three in one
 * pass, without the dicts.
 *
 * `decode(data, max_events, max_type_segments, max_segment_bytes, max_payload_bytes,
 * chunk_events, chunk_bytes, RegisterEvent, Timestamp, EventPayloadJson,
 * EventPayloadBinary)` gives `(events, spans)`: exactly the RegisterEvents the Python
 * path decodes before `check_client_event` (of those very namedtuple classes) and the
 * `(start, end of type, end)` spans `slices` records. Or None whenever anything is off
 * the fast path: malformed or truncated data, an Integer beyond 64 bits, a choice or
 * option not in its one-byte form, invalid UTF-8, trailing bytes, any limit exceeded,
 * and a request `slices` would cut into more than one slice. `wire.decode_register_now`
 * then runs the Python path, which handles it or raises its precise error: every error
 * message stays in wire.py. Only Python's own errors are raised here (a wrong argument
 * type, MemoryError).
 *
 * `splice(...)` builds the registered events' stored bytes from the request's bytes
 * (wire.splice_elements, below).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "../common/sbs_read.h" /* cursor, read_int, read_len, decode_text */
#include "../common/sbs_write.h" /* put_uint, nonneg_int64 */

/* The smallest event: an empty type and the two Optional bytes, one byte each. */
#define MIN_EVENT 3

/* An instance of the namedtuple class `cls` holding the `n` new references `items`
 * (stolen; all non-NULL), as `tuple.__new__(cls, items)` makes it. */
static PyObject *
make(PyTypeObject *cls, Py_ssize_t n, PyObject **items)
{
#if PY_VERSION_HEX < 0x030E0000
    /* What CPython's tuple_subtype_new does, without the temporary tuple. */
    PyObject *obj = cls->tp_alloc(cls, n);
    if (obj == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(obj, i, items[i]);
    return obj;
#else
    /* 3.14 caches a tuple's hash in the object: let tuple.__new__ initialise it. */
    PyObject *plain = PyTuple_New(n);
    if (plain == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(plain, i, items[i]);
    PyObject *args = PyTuple_Pack(1, plain);
    Py_DECREF(plain);
    if (args == NULL)
        return NULL;
    PyObject *obj = PyTuple_Type.tp_new(cls, args, NULL);
    Py_DECREF(args);
    return obj;
#endif
fail:
    for (Py_ssize_t i = 0; i < n; i++)
        Py_DECREF(items[i]);
    return NULL;
}

typedef struct {
    int64_t max_type_segments, max_segment_bytes, max_payload_bytes;
    PyTypeObject *event_cls, *timestamp_cls, *json_cls, *binary_cls;
    /* The previous event's type (its bytes in the request and its tuple) and source
     * timestamp, reused when the next event repeats them (a request's events often do). */
    Py_ssize_t type_at, type_size;
    PyObject *type_obj;
    int64_t s, us;
    PyObject *ts_obj;
} state;

/* The type (Array(String)) at the cursor as a tuple of str, a new reference; NULL with
 * *off set when off the fast path, NULL with a Python error on failure. */
static PyObject *
read_type(cursor *c, state *st, int *off)
{
    Py_ssize_t at = c->pos, segments, n;
    int64_t count;
    if (read_int(c, &count) < 0 || count < 0 || count > st->max_type_segments ||
        count > c->end - c->pos)
        goto off;
    segments = (Py_ssize_t)count;
    /* Walked first: a repeated type is compared by its bytes, not decoded again. */
    for (Py_ssize_t k = 0; k < segments; k++) {
        if (read_len(c, &n) < 0 || n > st->max_segment_bytes)
            goto off;
        c->pos += n;
    }
    Py_ssize_t size = c->pos - at;
    if (st->type_obj != NULL && st->type_size == size &&
        memcmp(c->buf + st->type_at, c->buf + at, (size_t)size) == 0)
        return Py_NewRef(st->type_obj);
    PyObject *type = PyTuple_New(segments);
    if (type == NULL)
        return NULL;
    cursor t = {c->buf, at, c->pos}; /* the same walk again (it cannot fail now) */
    (void)read_int(&t, &count);
    for (Py_ssize_t k = 0; k < segments; k++) {
        PyObject *segment = NULL;
        if (read_len(&t, &n) < 0)
            *off = 1;
        else
            segment = decode_text(t.buf + t.pos, n, off);
        if (segment == NULL) {
            Py_DECREF(type);
            return NULL;
        }
        PyTuple_SET_ITEM(type, k, segment);
        t.pos += n;
    }
    Py_XSETREF(st->type_obj, Py_NewRef(type));
    st->type_at = at;
    st->type_size = size;
    return type;
off:
    *off = 1;
    return NULL;
}

/* The source timestamp (Optional(Timestamp)) at the cursor: a Timestamp or None, a new
 * reference; NULL with *off set or a Python error as `read_type`. */
static PyObject *
read_source_timestamp(cursor *c, state *st, int *off)
{
    if (c->pos >= c->end)
        goto off;
    unsigned char option = c->buf[c->pos++];
    if (option == 0x80)
        return Py_NewRef(Py_None);
    int64_t s, us;
    if (option != 0x81 || read_int(c, &s) < 0 || read_int(c, &us) < 0)
        goto off;
    if (st->ts_obj != NULL && st->s == s && st->us == us)
        return Py_NewRef(st->ts_obj);
    PyObject *items[2] = {PyLong_FromLongLong(s), PyLong_FromLongLong(us)};
    if (items[0] == NULL || items[1] == NULL) {
        Py_XDECREF(items[0]);
        Py_XDECREF(items[1]);
        return NULL;
    }
    PyObject *ts = make(st->timestamp_cls, 2, items);
    if (ts == NULL)
        return NULL;
    Py_XSETREF(st->ts_obj, Py_NewRef(ts));
    st->s = s;
    st->us = us;
    return ts;
off:
    *off = 1;
    return NULL;
}

/* The payload (Optional(Choice {binary: Record {type: String, data: Bytes}, json:
 * String})) at the cursor: None, an EventPayloadJson or an EventPayloadBinary, a new
 * reference; NULL with *off set or a Python error as `read_type`. */
static PyObject *
read_payload(cursor *c, state *st, int *off)
{
    if (c->pos >= c->end)
        goto off;
    unsigned char option = c->buf[c->pos++];
    if (option == 0x80)
        return Py_NewRef(Py_None);
    if (option != 0x81 || c->pos >= c->end)
        goto off;
    unsigned char kind = c->buf[c->pos++];
    Py_ssize_t n;
    if (kind == 0x81) { /* json */
        if (read_len(c, &n) < 0 || n > st->max_payload_bytes)
            goto off;
        PyObject *items[1] = {decode_text(c->buf + c->pos, n, off)};
        if (items[0] == NULL)
            return NULL;
        c->pos += n;
        return make(st->json_cls, 1, items);
    }
    if (kind != 0x80) /* binary */
        goto off;
    Py_ssize_t type_n, type_at;
    if (read_len(c, &type_n) < 0)
        goto off;
    type_at = c->pos;
    c->pos += type_n;
    if (read_len(c, &n) < 0 || n > st->max_payload_bytes)
        goto off;
    PyObject *items[2] = {decode_text(c->buf + type_at, type_n, off), NULL};
    if (items[0] == NULL)
        return NULL;
    items[1] = PyBytes_FromStringAndSize((const char *)c->buf + c->pos, n);
    if (items[1] == NULL) {
        Py_DECREF(items[0]);
        return NULL;
    }
    c->pos += n;
    return make(st->binary_cls, 2, items);
off:
    *off = 1;
    return NULL;
}

/* `(start, end of type, end)`, a new reference. */
static PyObject *
make_span(Py_ssize_t start, Py_ssize_t type_end, Py_ssize_t end)
{
    PyObject *span = PyTuple_New(3), *item;
    if (span == NULL)
        return NULL;
    Py_ssize_t values[3] = {start, type_end, end};
    for (int k = 0; k < 3; k++) {
        if ((item = PyLong_FromSsize_t(values[k])) == NULL) {
            Py_DECREF(span);
            return NULL;
        }
        PyTuple_SET_ITEM(span, k, item);
    }
    return span;
}

/* An int argument as an int64 (saturated: a limit beyond it is no limit); -1 with a
 * TypeError when it is not an int. */
static int
int_arg(PyObject *arg, const char *name, int64_t *out)
{
    if (!PyLong_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "decode: %s must be an int, not %.100s", name,
                     Py_TYPE(arg)->tp_name);
        return -1;
    }
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(arg, &overflow);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = overflow > 0 ? INT64_MAX : overflow < 0 ? INT64_MIN : v;
    return 0;
}

/* A namedtuple class argument: a tuple subclass. */
static int
class_arg(PyObject *arg, const char *name, PyTypeObject **out)
{
    if (!PyType_Check(arg) || !PyType_IsSubtype((PyTypeObject *)arg, &PyTuple_Type) ||
        (PyTypeObject *)arg == &PyTuple_Type) {
        PyErr_Format(PyExc_TypeError, "decode: %s must be a namedtuple class", name);
        return -1;
    }
    *out = (PyTypeObject *)arg;
    return 0;
}

static PyObject *
register_decode(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 11) {
        PyErr_Format(PyExc_TypeError, "decode takes 11 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!PyBytes_Check(args[0])) {
        PyErr_Format(PyExc_TypeError, "decode: data must be bytes, not %.100s",
                     Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    state st = {0};
    int64_t max_events, chunk_events, chunk_bytes;
    if (int_arg(args[1], "max_events", &max_events) < 0 ||
        int_arg(args[2], "max_type_segments", &st.max_type_segments) < 0 ||
        int_arg(args[3], "max_segment_bytes", &st.max_segment_bytes) < 0 ||
        int_arg(args[4], "max_payload_bytes", &st.max_payload_bytes) < 0 ||
        int_arg(args[5], "chunk_events", &chunk_events) < 0 ||
        int_arg(args[6], "chunk_bytes", &chunk_bytes) < 0 ||
        class_arg(args[7], "RegisterEvent", &st.event_cls) < 0 ||
        class_arg(args[8], "Timestamp", &st.timestamp_cls) < 0 ||
        class_arg(args[9], "EventPayloadJson", &st.json_cls) < 0 ||
        class_arg(args[10], "EventPayloadBinary", &st.binary_cls) < 0)
        return NULL;

    cursor c = {(const unsigned char *)PyBytes_AS_STRING(args[0]), 0, PyBytes_GET_SIZE(args[0])};
    int64_t count;
    /* More events than one slice or than the request may hold (`slices` refuses or cuts
     * it), or than the bytes can hold (the walk fails): no list is made for them. */
    if (read_int(&c, &count) < 0 || count < 0 || count > max_events || count > chunk_events ||
        count > (c.end - c.pos) / MIN_EVENT)
        Py_RETURN_NONE;
    int off = 0;
    PyObject *events = PyList_New((Py_ssize_t)count);
    PyObject *spans = PyList_New((Py_ssize_t)count);
    if (events == NULL || spans == NULL)
        goto fail;
    Py_ssize_t first = c.pos;
    for (Py_ssize_t i = 0; i < (Py_ssize_t)count; i++) {
        /* `slices` starts another slice before an event when the slice already has more
         * than chunk_bytes bytes. */
        Py_ssize_t start = c.pos;
        if (i > 0 && start - first > chunk_bytes) {
            off = 1;
            goto fail;
        }
        PyObject *items[3] = {read_type(&c, &st, &off), NULL, NULL};
        if (items[0] == NULL)
            goto fail;
        Py_ssize_t type_end = c.pos;
        if ((items[1] = read_source_timestamp(&c, &st, &off)) == NULL) {
            Py_DECREF(items[0]);
            goto fail;
        }
        if ((items[2] = read_payload(&c, &st, &off)) == NULL) {
            Py_DECREF(items[0]);
            Py_DECREF(items[1]);
            goto fail;
        }
        PyObject *event = make(st.event_cls, 3, items);
        if (event == NULL)
            goto fail;
        PyList_SET_ITEM(events, i, event);
        PyObject *span = make_span(start, type_end, c.pos);
        if (span == NULL)
            goto fail;
        PyList_SET_ITEM(spans, i, span);
    }
    if (c.pos != c.end) {
        off = 1; /* bytes after the last event */
        goto fail;
    }
    Py_CLEAR(st.type_obj);
    Py_CLEAR(st.ts_obj);
    PyObject *result = PyTuple_Pack(2, events, spans);
    Py_DECREF(events);
    Py_DECREF(spans);
    return result;
fail:
    Py_CLEAR(st.type_obj);
    Py_CLEAR(st.ts_obj);
    Py_XDECREF(events); /* a list's empty slots are NULL, which its deallocation skips */
    Py_XDECREF(spans);
    if (off)
        Py_RETURN_NONE;
    return NULL;
}

/* splice(request, spans, server, session, instance, ts_s, ts_us) -> list[bytes] | None:
 * wire.splice_elements in C. Each registered event's SBS `Event` bytes from the
 * request's bytes of its span `(start, end of type, end)`: its id (server, session and
 * `instance` counting up from the first), the request's bytes of its type, the
 * registration's timestamp, the request's bytes of the rest. None for anything the
 * Python code must judge: a number negative or beyond int64, a span that is not three
 * ints inside the request. */
static PyObject *
register_splice(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 || !PyBytes_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "splice(request: bytes, spans: list, server, session, instance, ts_s, "
                        "ts_us)");
        return NULL;
    }
    int64_t v[5]; /* server, session, instance, ts_s, ts_us */
    for (int i = 0; i < 5; i++) {
        v[i] = nonneg_int64(args[2 + i]);
        if (v[i] < 0)
            Py_RETURN_NONE;
    }
    const char *request = PyBytes_AS_STRING(args[0]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    PyObject *spans = args[1];
    Py_ssize_t count = PyList_GET_SIZE(spans);
    if (v[2] > INT64_MAX - count) /* the last instance stays an int64 */
        Py_RETURN_NONE;
    unsigned char id[2 * SBS_INT_MAX_BYTES], ts[2 * SBS_INT_MAX_BYTES];
    unsigned char instance[SBS_INT_MAX_BYTES];
    int id_len = put_uint(id, (uint64_t)v[0]);
    id_len += put_uint(id + id_len, (uint64_t)v[1]);
    int ts_len = put_uint(ts, (uint64_t)v[3]);
    ts_len += put_uint(ts + ts_len, (uint64_t)v[4]);
    PyObject *out = PyList_New(count);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *span = PyList_GET_ITEM(spans, i);
        Py_ssize_t at[3]; /* start, end of type, end */
        if (!PyTuple_CheckExact(span) || PyTuple_GET_SIZE(span) != 3)
            goto off;
        for (int k = 0; k < 3; k++) {
            PyObject *o = PyTuple_GET_ITEM(span, k);
            if (!PyLong_CheckExact(o))
                goto off;
            at[k] = PyLong_AsSsize_t(o);
            if (at[k] == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                goto off;
            }
        }
        if (at[0] < 0 || at[1] < at[0] || at[2] < at[1] || at[2] > size)
            goto off;
        int instance_len = put_uint(instance, (uint64_t)v[2] + (uint64_t)i);
        Py_ssize_t type_len = at[1] - at[0], rest_len = at[2] - at[1];
        PyObject *element =
            PyBytes_FromStringAndSize(NULL, id_len + instance_len + type_len + ts_len + rest_len);
        if (element == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        char *p = PyBytes_AS_STRING(element);
        memcpy(p, id, id_len);
        p += id_len;
        memcpy(p, instance, instance_len);
        p += instance_len;
        memcpy(p, request + at[0], type_len);
        p += type_len;
        memcpy(p, ts, ts_len);
        p += ts_len;
        memcpy(p, request + at[1], rest_len);
        PyList_SET_ITEM(out, i, element);
    }
    return out;
off:
    Py_DECREF(out); /* the items not set yet are NULL, which the list's dealloc skips */
    Py_RETURN_NONE;
}

static PyMethodDef register_methods[] = {
    {"decode", (PyCFunction)(void (*)(void))register_decode, METH_FASTCALL,
     "decode(data, max_events, max_type_segments, max_segment_bytes, max_payload_bytes, "
     "chunk_events, chunk_bytes, RegisterEvent, Timestamp, EventPayloadJson, "
     "EventPayloadBinary): (events, spans) of the one-slice MsgRegisterReq `data`, exactly "
     "as wire.py's Python path gives them before check_client_event, or None when anything "
     "is off the fast path (then the Python path handles it or raises its error)."},
    {"splice", (PyCFunction)(void (*)(void))register_splice, METH_FASTCALL,
     "splice(request, spans, server, session, instance, ts_s, ts_us): the registered "
     "events' SBS Event bytes spliced from the request, exactly as wire.splice_elements "
     "gives them, or None when its Python code must judge the arguments."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef register_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_register",
    .m_doc = "The Eventer's decode of a one-slice MsgRegisterReq.",
    .m_size = -1,
    .m_methods = register_methods,
};

PyMODINIT_FUNC
PyInit__register(void)
{
    return PyModule_Create(&register_module);
}
