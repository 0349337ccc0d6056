/* eventfleet_server.bus._drain: read every message queued on a ZeroMQ socket in one call.
 *
 * Why: the collector reads a PUB as seven frames. Through pyzmq each frame costs a
 * Python call, a Frame object and a copy (~1 us each, ~7 us per PUB, about a sixth of
 * the replica's CPU per PUB at full load). Here the whole queue is read in one call and
 * each frame becomes one bytes object.
 *
 * libzmq is not linked: `bind(path)` opens the copy pyzmq has already loaded (RTLD_NOLOAD:
 * the same library, hence the same sockets) and looks up the six functions used. The
 * socket is pyzmq's `Socket.underlying` (the libzmq socket's address). The caller owns
 * the socket and calls from the thread that uses it, as with any ZeroMQ socket.
 *
 * `bus/drain.py` is the only user; it falls back to pyzmq when this module is missing or
 * `bind` fails, and the tests compare the two on the same messages.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>

/* libzmq's message type: 64 opaque bytes aligned as a pointer (zmq.h, libzmq 4.x). */
typedef struct {
    unsigned char _[64];
} __attribute__((aligned(sizeof(void *)))) zmq_msg_t;

#define ZMQ_DONTWAIT 1

static int (*msg_init)(zmq_msg_t *);
static int (*msg_recv)(zmq_msg_t *, void *, int);
static void *(*msg_data)(zmq_msg_t *);
static size_t (*msg_size)(const zmq_msg_t *);
static int (*msg_more)(const zmq_msg_t *);
static int (*msg_close)(zmq_msg_t *);
static int (*zmq_errno_fn)(void);

static PyObject *
drain_bind(PyObject *Py_UNUSED(self), PyObject *args)
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
        {"zmq_msg_init", (void **)&msg_init},   {"zmq_msg_recv", (void **)&msg_recv},
        {"zmq_msg_data", (void **)&msg_data},   {"zmq_msg_size", (void **)&msg_size},
        {"zmq_msg_more", (void **)&msg_more},   {"zmq_msg_close", (void **)&msg_close},
        {"zmq_errno", (void **)&zmq_errno_fn},
    };
    for (size_t i = 0; i < sizeof(wanted) / sizeof(wanted[0]); i++) {
        void *fn = dlsym(lib, wanted[i].name);
        if (fn == NULL) {
            msg_recv = NULL; /* unusable: `drain` refuses */
            PyErr_Format(PyExc_OSError, "%s has no %s", path, wanted[i].name);
            return NULL;
        }
        *wanted[i].slot = fn;
    }
    Py_RETURN_NONE;
}

/* One frame into a new bytes object; NULL with `*err` set to the errno on failure
 * (EAGAIN: nothing queued), or NULL with a Python error set (`*err` 0). */
static PyObject *
recv_frame(void *sock, int flags, int *more, int *err)
{
    zmq_msg_t msg;
    msg_init(&msg);
    if (msg_recv(&msg, sock, flags) < 0) {
        *err = zmq_errno_fn();
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
drain_drain(PyObject *Py_UNUSED(self), PyObject *args)
{
    unsigned long long address;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "Kn", &address, &limit))
        return NULL;
    if (msg_recv == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_drain.bind has not succeeded");
        return NULL;
    }
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
            if (err != 0)
                goto zmq_error;
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
            frame = recv_frame(sock, 0, &more, &err);
            if (frame == NULL) {
                if (err != 0)
                    goto zmq_error;
                goto fail;
            }
            appended = PyList_Append(message, frame);
            Py_DECREF(frame);
            if (appended < 0)
                goto fail;
        }
    }
    return out;
zmq_error:
    /* The caller turns this into zmq.ZMQError (bus/drain.py). */
    {
        PyObject *value = Py_BuildValue("(is)", err, "zmq_msg_recv failed");
        if (value != NULL) {
            PyErr_SetObject(PyExc_OSError, value);
            Py_DECREF(value);
        }
    }
fail:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef drain_methods[] = {
    {"bind", drain_bind, METH_VARARGS,
     "bind(path): use the libzmq at `path`, already loaded by pyzmq."},
    {"drain", drain_drain, METH_VARARGS,
     "drain(socket_address, limit): up to `limit` queued messages, each a list of its "
     "frames as bytes; [] when none is queued."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef drain_module = {
    PyModuleDef_HEAD_INIT, "_drain", "Reads the messages queued on a ZeroMQ socket.", -1,
    drain_methods,
};

PyMODINIT_FUNC
PyInit__drain(void)
{
    return PyModule_Create(&drain_module);
}
