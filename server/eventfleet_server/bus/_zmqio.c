/* eventfleet_server.bus._zmqio: the Event BUS's per-event ZeroMQ frame loops, in C.
 *
 * Why: a PUB is read as seven frames and a BROADCAST sent as six. Through pyzmq each frame
 * costs a Python call (and, read, a Frame object and a copy): ~7-10 us per PUB read and
 * ~3 us per BROADCAST sent, a fifth of the replica's CPU per PUB at full load. Here one
 * call reads every queued message (`drain`) or sends a whole commit's BROADCASTs
 * (`broadcast`).
 *
 * libzmq is not linked: `bind(path)` opens the copy pyzmq has already loaded (RTLD_NOLOAD:
 * the same library, hence the same sockets) and looks up the functions used. A socket is
 * pyzmq's `Socket.underlying` (the libzmq socket's address). The caller owns the socket
 * and calls from the thread that uses it, as with any ZeroMQ socket; nothing here
 * releases the GIL (every call is non-blocking).
 *
 * `bus/zmqio.py` is the only user; it falls back to pyzmq when this module is missing or
 * `bind` fails, and the tests compare the two on the same messages.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* libzmq's message type: 64 opaque bytes aligned as a pointer (zmq.h, libzmq 4.x). */
typedef struct {
    unsigned char _[64];
} __attribute__((aligned(sizeof(void *)))) zmq_msg_t;

#define ZMQ_DONTWAIT 1
#define ZMQ_SNDMORE 2

static int (*msg_init)(zmq_msg_t *);
static int (*msg_recv)(zmq_msg_t *, void *, int);
static void *(*msg_data)(zmq_msg_t *);
static size_t (*msg_size)(const zmq_msg_t *);
static int (*msg_more)(const zmq_msg_t *);
static int (*msg_close)(zmq_msg_t *);
static int (*zsend)(void *, const void *, size_t, int);
static int (*zerrno)(void);
static int bound;

static PyObject *
zmqio_bind(PyObject *Py_UNUSED(self), PyObject *args)
{
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path))
        return NULL;
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) {
        PyErr_Format(PyExc_OSError, "libzmq %s is not loaded: %s", path, dlerror());
        return NULL;
    }
    struct {
        const char *name;
        void **slot;
    } wanted[] = {
        {"zmq_msg_init", (void **)&msg_init}, {"zmq_msg_recv", (void **)&msg_recv},
        {"zmq_msg_data", (void **)&msg_data}, {"zmq_msg_size", (void **)&msg_size},
        {"zmq_msg_more", (void **)&msg_more}, {"zmq_msg_close", (void **)&msg_close},
        {"zmq_send", (void **)&zsend},        {"zmq_errno", (void **)&zerrno},
    };
    bound = 0;
    for (size_t i = 0; i < sizeof(wanted) / sizeof(wanted[0]); i++) {
        void *fn = dlsym(lib, wanted[i].name);
        if (fn == NULL) {
            PyErr_Format(PyExc_OSError, "%s has no %s", path, wanted[i].name);
            return NULL;
        }
        *wanted[i].slot = fn;
    }
    bound = 1;
    Py_RETURN_NONE;
}

/* OSError(errno, ...) for `bus/zmqio.py` to turn into zmq.ZMQError. */
static PyObject *
zmq_failure(int err, const char *what)
{
    PyObject *value = Py_BuildValue("(is)", err, what);
    if (value != NULL) {
        PyErr_SetObject(PyExc_OSError, value);
        Py_DECREF(value);
    }
    return NULL;
}

static int
check_bound(void)
{
    if (!bound) {
        PyErr_SetString(PyExc_RuntimeError, "_zmqio.bind has not succeeded");
        return 0;
    }
    return 1;
}

/* -- drain ------------------------------------------------------------------------- */

/* One frame into a new bytes object; NULL with `*err` set to the errno on failure
 * (EAGAIN: nothing queued), or NULL with a Python error set (`*err` 0). */
static PyObject *
recv_frame(void *sock, int flags, int *more, int *err)
{
    zmq_msg_t msg;
    msg_init(&msg);
    if (msg_recv(&msg, sock, flags) < 0) {
        *err = zerrno();
        msg_close(&msg);
        return NULL;
    }
    *err = 0;
    PyObject *frame = PyBytes_FromStringAndSize(msg_data(&msg), (Py_ssize_t)msg_size(&msg));
    *more = msg_more(&msg);
    msg_close(&msg);
    return frame;
}

static PyObject *
zmqio_drain(PyObject *Py_UNUSED(self), PyObject *args)
{
    unsigned long long address;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "Kn", &address, &limit))
        return NULL;
    if (!check_bound())
        return NULL;
    void *sock = (void *)(uintptr_t)address;
    int more = 0, err = 0;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    while (PyList_GET_SIZE(out) < limit) {
        PyObject *frame = recv_frame(sock, ZMQ_DONTWAIT, &more, &err);
        if (frame == NULL) {
            if (err == EAGAIN || err == EINTR)
                break; /* the queue is empty (or a signal): what was read so far */
            goto fail;
        }
        PyObject *message = PyList_New(1);
        if (message == NULL) {
            Py_DECREF(frame);
            goto fail;
        }
        PyList_SET_ITEM(message, 0, frame);
        int appended = PyList_Append(out, message);
        Py_DECREF(message);
        if (appended < 0)
            goto fail;
        /* The rest of a multipart message is queued with its first frame (ZeroMQ
         * delivers messages whole), so these reads do not wait. */
        while (more) {
            /* A signal can only interrupt a wait, and these reads do not wait; retried
             * all the same, as pyzmq does, rather than losing the rest of a message. */
            do {
                frame = recv_frame(sock, 0, &more, &err);
            } while (frame == NULL && err == EINTR);
            if (frame == NULL)
                goto fail;
            appended = PyList_Append(message, frame);
            Py_DECREF(frame);
            if (appended < 0)
                goto fail;
        }
    }
    return out;
fail:
    Py_DECREF(out);
    return err != 0 ? zmq_failure(err, "zmq_msg_recv failed") : NULL;
}

/* -- broadcast ---------------------------------------------------------------------- */

static int
send_bytes(void *sock, PyObject *frame, int flags)
{
    char *data;
    Py_ssize_t size;
    if (PyBytes_AsStringAndSize(frame, &data, &size) < 0)
        return -1;
    if (zsend(sock, data, (size_t)size, flags) < 0) {
        zmq_failure(zerrno(), "zmq_send failed");
        return -1;
    }
    return 0;
}

static PyObject *
zmqio_broadcast(PyObject *Py_UNUSED(self), PyObject *args)
{
    unsigned long long address;
    PyObject *items;
    int rfc;
    if (!PyArg_ParseTuple(args, "KOp", &address, &items, &rfc))
        return NULL;
    if (!check_bound())
        return NULL;
    void *sock = (void *)(uintptr_t)address;
    PyObject *seq_items = PySequence_Fast(items, "broadcast: items must be a sequence");
    if (seq_items == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq_items);
    const int more = ZMQ_SNDMORE | ZMQ_DONTWAIT;
    /* Everything is checked before the first frame of a message is sent: an error in
     * the middle would leave a part-sent multipart message on the socket. */
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq_items, i);
        PyObject *seq_obj, *frames;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_Format(PyExc_TypeError, "broadcast: item %zd is not (sequence, frames)", i);
            goto fail;
        }
        seq_obj = PyTuple_GET_ITEM(item, 0);
        frames = PyTuple_GET_ITEM(item, 1);
        if (!PyTuple_Check(frames) || PyTuple_GET_SIZE(frames) != 5) {
            PyErr_Format(PyExc_TypeError, "broadcast: item %zd's frames are not 5 bytes", i);
            goto fail;
        }
        for (Py_ssize_t f = 0; f < 5; f++) {
            if (!PyBytes_Check(PyTuple_GET_ITEM(frames, f))) {
                PyErr_Format(PyExc_TypeError, "broadcast: item %zd frame %zd is not bytes", i, f);
                goto fail;
            }
        }
        unsigned long long seq = PyLong_AsUnsignedLongLong(seq_obj);
        if (seq == (unsigned long long)-1 && PyErr_Occurred())
            goto fail;
        unsigned char seq_frame[24];
        size_t seq_size;
        if (rfc) {
            for (int b = 0; b < 8; b++)
                seq_frame[b] = (unsigned char)(seq >> (56 - 8 * b));
            seq_size = 8;
        } else {
            seq_size = (size_t)snprintf((char *)seq_frame, sizeof(seq_frame), "%llu", seq);
        }
        /* topic, sequence, producer, timestamp, uuid, data */
        if (send_bytes(sock, PyTuple_GET_ITEM(frames, 0), more) < 0)
            goto fail;
        if (zsend(sock, seq_frame, seq_size, more) < 0) {
            zmq_failure(zerrno(), "zmq_send failed");
            goto fail;
        }
        if (send_bytes(sock, PyTuple_GET_ITEM(frames, 1), more) < 0 ||
            send_bytes(sock, PyTuple_GET_ITEM(frames, 2), more) < 0 ||
            send_bytes(sock, PyTuple_GET_ITEM(frames, 3), more) < 0 ||
            send_bytes(sock, PyTuple_GET_ITEM(frames, 4), ZMQ_DONTWAIT) < 0)
            goto fail;
    }
    Py_DECREF(seq_items);
    Py_RETURN_NONE;
fail:
    Py_DECREF(seq_items);
    return NULL;
}

static PyMethodDef zmqio_methods[] = {
    {"bind", zmqio_bind, METH_VARARGS,
     "bind(path): use the libzmq at `path`, already loaded by pyzmq."},
    {"drain", zmqio_drain, METH_VARARGS,
     "drain(socket_address, limit): up to `limit` queued messages, each a list of its "
     "frames as bytes; [] when none is queued."},
    {"broadcast", zmqio_broadcast, METH_VARARGS,
     "broadcast(socket_address, items, rfc): send each (sequence, (topic, producer, "
     "timestamp, uuid, data)) as one six-frame message, without waiting; the sequence "
     "frame is 8 bytes big-endian if `rfc`, else ASCII decimal."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef zmqio_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_zmqio",
    .m_doc = "The Event BUS's per-event ZeroMQ frame loops.",
    .m_size = -1,
    .m_methods = zmqio_methods,
};

PyMODINIT_FUNC
PyInit__zmqio(void)
{
    return PyModule_Create(&zmqio_module);
}
