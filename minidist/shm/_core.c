/* minidist.shm._core: the compiled executor of the shared-memory paths' per-call work.
 *
 * One protocol, two executors: the layouts and their ordering argument are written once,
 * in Python (minidist.shm.fast_slots, minidist.shm.area_layout, minidist.shm.rooted_area, minidist.shm.inbox);
 * this module receives every offset from there when an area is made, checks each against
 * the segment's size once, and then runs a call's whole role in one C call. The pure
 * executor (the same modules' Python methods) runs the same steps in the same order, so a
 * job may mix ranks of either core.
 *
 * Ordering: x86-64 TSO, as the Python modules argue; here the compiler is held to program
 * order by atomic loads and stores (relaxed on the data, release on the words that publish,
 * acquire on the words that are waited for) and the Dekker fences are
 * __atomic_thread_fence(__ATOMIC_SEQ_CST) (mfence).
 *
 * Waits: spin (or yield) briefly, then one futex sleep of at most a slice, with the GIL
 * released throughout; a wait that did not end within that returns WAIT_MORE and the
 * Python side does its checks (deadline, lost ranks, aborts, stall report) and waits on.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#if !defined(__x86_64__)
#error "minidist.shm._core: x86-64 only (the ordering argument counts on TSO)"
#endif

#define KEY 28            /* the signature bytes ranks compare */
#define SEQ_AT 32         /* the call's number in a header (int64) */
#define RELEASE 48
#define SLEEPING_RELEASE 56
#define ARRIVED 60
#define DIFFERS 44

enum { DONE = 0, DIFFER = 1, WAIT_MORE = 2, SETTLE_LATE = 3, SETTLE_DIFFERS = 4 };

/* ------------------------------------------------------------------ clocks and futexes */

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int32_t load32(const volatile void *p) {
    return __atomic_load_n((const int32_t *)p, __ATOMIC_ACQUIRE);
}

static inline void store32(volatile void *p, int32_t v) {
    __atomic_store_n((int32_t *)p, v, __ATOMIC_RELEASE);
}

static inline void store64(volatile void *p, int64_t v) {
    __atomic_store_n((int64_t *)p, v, __ATOMIC_RELEASE);
}

static inline void fence_full(void) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }

/* The words this process's threads sleep on, so that news of a peer (it died, it left)
 * wakes them at once (wake_sleepers); a sleeper not found a place here sleeps its slice. */
#define SLEEPERS 64
static void *sleepers[SLEEPERS];

static inline void sys_futex_wait(void *addr, int32_t seen, double timeout) {
    if (timeout <= 0)
        return;
    struct timespec ts;
    ts.tv_sec = (time_t)timeout;
    ts.tv_nsec = (long)((timeout - (double)ts.tv_sec) * 1e9);
    int slot = -1;
    for (int i = 0; i < SLEEPERS; i++) {
        void *none = NULL;
        if (__atomic_compare_exchange_n(&sleepers[i], &none, addr, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST)) {
            slot = i;
            break;
        }
    }
    syscall(SYS_futex, addr, FUTEX_WAIT, seen, &ts, NULL, 0);
    if (slot >= 0)
        __atomic_store_n(&sleepers[slot], NULL, __ATOMIC_SEQ_CST);
}

static inline void sys_futex_wake(void *addr) {
    syscall(SYS_futex, addr, FUTEX_WAKE, 0x7FFFFFFF, NULL, NULL, 0);
}

static int32_t spare_word; /* FUTEX_WAKE_OP's first word: nobody sleeps on it */

static inline void sys_futex_add(void *addr, int equals) {
    int op = FUTEX_OP(FUTEX_OP_ADD, 1, FUTEX_OP_CMP_EQ, equals & 0xFFF);
    syscall(SYS_futex, &spare_word, FUTEX_WAKE_OP, 0, (void *)1, addr, op);
}

/* How long a waiter spins, then yields, before it sleeps; halved after a wait that it
 * did not pay for, back to full after one that did (minidist.shm.fast_slots.Patience). */
typedef struct {
    double spin_full, yield_full, spin, yielding;
} patience_t;

/* Spin (or yield) while `pat` allows, until ready(ctx): 1 once it is (the patience back
 * to full), 0 when the patience ran out (halved for the next wait). */
static int patient(patience_t *pat, int (*ready)(const void *), const void *ctx) {
    if (pat->spin > 0) {
        double end = now_s() + pat->spin;
        for (;;) {
            for (int i = 0; i < 64; i++) {
                if (ready(ctx)) {
                    pat->spin = pat->spin_full;
                    return 1;
                }
                __builtin_ia32_pause();
            }
            if (now_s() >= end)
                break;
        }
        pat->spin = pat->spin > 2e-6 ? pat->spin / 2 : 0;
    } else if (pat->yielding > 0) {
        double end = now_s() + pat->yielding;
        for (;;) {
            sched_yield();
            if (ready(ctx)) {
                pat->yielding = pat->yield_full;
                return 1;
            }
            if (now_s() >= end)
                break;
        }
        pat->yielding = pat->yielding > 5e-6 ? pat->yielding / 2 : 0;
    }
    return 0;
}

typedef struct {
    const int32_t *word;
    int32_t want;
} word_is_t;

static int word_is(const void *ctx) {
    const word_is_t *w = ctx;
    return load32(w->word) == w->want;
}

/* Until the int32 at `word` holds `want` (1), or a slice passed (0). `flag`: where a
 * sleeper says it sleeps (NULL: the writer always wakes), storing `flag_value`. Called
 * with the GIL released. */
static int wait_word_nogil(int32_t *word, int32_t want, int32_t *flag, int32_t flag_value,
                           patience_t *pat, double nap) {
    word_is_t is = {word, want};
    if (word_is(&is) || patient(pat, word_is, &is))
        return 1;
    double end = now_s() + nap;
    for (;;) {
        int32_t seen = load32(word);
        if (seen == want)
            return 1;
        double left = end - now_s();
        if (left <= 0)
            return 0;
        if (flag)
            store32(flag, flag_value); /* then the kernel's lock, then its look at the word */
        sys_futex_wait(word, seen, left);
    }
}

/* ------------------------------------------------------------------ module functions */

static int as_addr(PyObject *o, void **out) {
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    if (v == 0 || (v & 3)) {
        PyErr_SetString(PyExc_ValueError, "minidist.shm._core: a futex word's address must be "
                                          "non-zero and 4-byte aligned");
        return -1;
    }
    *out = (void *)(uintptr_t)v;
    return 0;
}

static int as_i32(PyObject *o, int32_t *out) {
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = (int32_t)v;
    return 0;
}

static PyObject *core_futex_wait(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    (void)self;
    void *addr;
    int32_t seen;
    if (n != 3) {
        PyErr_SetString(PyExc_TypeError, "futex_wait(addr, seen, timeout)");
        return NULL;
    }
    if (as_addr(args[0], &addr) < 0 || as_i32(args[1], &seen) < 0)
        return NULL;
    double timeout = PyFloat_AsDouble(args[2]);
    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    sys_futex_wait(addr, seen, timeout);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *core_futex_wake(PyObject *self, PyObject *arg) {
    (void)self;
    void *addr;
    if (as_addr(arg, &addr) < 0)
        return NULL;
    sys_futex_wake(addr);
    Py_RETURN_NONE;
}

static PyObject *core_futex_add(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    (void)self;
    void *addr;
    int32_t equals;
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "futex_add(addr, equals)");
        return NULL;
    }
    if (as_addr(args[0], &addr) < 0 || as_i32(args[1], &equals) < 0)
        return NULL;
    sys_futex_add(addr, equals);
    Py_RETURN_NONE;
}

static PyObject *core_wake_sleepers(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    for (int i = 0; i < SLEEPERS; i++) {
        void *addr = __atomic_load_n(&sleepers[i], __ATOMIC_SEQ_CST);
        if (addr)
            sys_futex_wake(addr);
    }
    Py_RETURN_NONE;
}

static PyObject *core_fence(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    fence_full();
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ a mapped segment */

/* What an Area and a Box share (their first member): the segment's buffer, held while
 * the object lives or until release(); where their part of it starts and its size; the
 * waiter's patience. */
typedef struct {
    PyObject_HEAD
    Py_buffer seg;
    int held;
    char *start;
    Py_ssize_t bytes;
    patience_t pat;
} Mapped;

/* Hold `buf` (a writable buffer), letting go of any held before. */
static int mapped_hold(Mapped *m, PyObject *buf) {
    if (m->held) {
        PyBuffer_Release(&m->seg);
        m->held = 0;
    }
    if (PyObject_GetBuffer(buf, &m->seg, PyBUF_WRITABLE | PyBUF_SIMPLE) < 0)
        return -1;
    m->held = 1;
    m->pat.spin_full = m->pat.spin = 0;
    m->pat.yield_full = m->pat.yielding = 0;
    return 0;
}

/* A layout that does not fit: let go of the buffer, raise ValueError naming `what`. */
static int mapped_refuse(Mapped *m, const char *what) {
    PyBuffer_Release(&m->seg);
    m->held = 0;
    PyErr_Format(PyExc_ValueError, "minidist.shm._core.%s: the layout does not fit the segment",
                 what);
    return -1;
}

static void Mapped_dealloc(Mapped *m) {
    if (m->held)
        PyBuffer_Release(&m->seg);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyObject *Mapped_release(Mapped *m, PyObject *unused) {
    (void)unused;
    if (m->held) {
        PyBuffer_Release(&m->seg);
        m->held = 0;
    }
    m->start = NULL;
    Py_RETURN_NONE;
}

static PyObject *Mapped_fit(Mapped *m, PyObject *const *args, Py_ssize_t n) {
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "fit(spin, yielding)");
        return NULL;
    }
    double s = PyFloat_AsDouble(args[0]), y = PyFloat_AsDouble(args[1]);
    if (PyErr_Occurred())
        return NULL;
    m->pat.spin_full = m->pat.spin = s;
    m->pat.yield_full = m->pat.yielding = y;
    Py_RETURN_NONE;
}

/* the methods every mapped type has, ending its table; and its type object */
#define MAPPED_METHODS                                                                  \
    {"fit", (PyCFunction)(void (*)(void))Mapped_fit, METH_FASTCALL, NULL},              \
        {"release", (PyCFunction)Mapped_release, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}
#define MAPPED_TYPE(T, doc)                                                             \
    {                                                                                   \
        PyVarObject_HEAD_INIT(NULL, 0).tp_name = "minidist.shm._core." #T,                  \
        .tp_basicsize = sizeof(T), .tp_flags = Py_TPFLAGS_DEFAULT, .tp_doc = doc,       \
        .tp_new = PyType_GenericNew, .tp_init = (initproc)T##_init,                     \
        .tp_dealloc = (destructor)Mapped_dealloc, .tp_methods = T##_methods,            \
    }

/* ------------------------------------------------------------------ the rooted area */

typedef struct {
    Mapped m;          /* the group's fast segment; start: the rooted area's first byte */
    int n, me;
    Py_ssize_t header, done_at, pieces_at, piece;
} Area;

static inline char *head_of(Area *a, int rank, int parity) {
    return a->m.start + ((Py_ssize_t)rank * 2 + parity) * a->header;
}

static inline char *piece_of(Area *a, int parity, int rank) {
    return a->m.start + a->pieces_at + ((Py_ssize_t)parity * a->n + rank) * a->piece;
}

static inline int64_t *done_of(Area *a, int rank) {
    return (int64_t *)(a->m.start + a->done_at) + rank;
}

static int Area_init(Area *a, PyObject *args, PyObject *kw) {
    PyObject *buf;
    Py_ssize_t offset, bytes, header, done_at, pieces_at, piece;
    int n, me;
    static char *names[] = {"buf", "offset", "nbytes", "size", "me", "header", "done_at",
                            "pieces_at", "piece", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Onniinnnn", names, &buf, &offset, &bytes,
                                     &n, &me, &header, &done_at, &pieces_at, &piece))
        return -1;
    if (mapped_hold(&a->m, buf) < 0)
        return -1;
    /* every offset is checked against the segment once, here */
    int bad = n < 2 || me < 0 || me >= n || header < 64 || offset < 0 || bytes < 0 ||
              offset > a->m.seg.len || bytes > a->m.seg.len - offset || piece < 0 ||
              done_at < 2 * (Py_ssize_t)n * header || done_at + 8 * (Py_ssize_t)n > pieces_at ||
              pieces_at > bytes || (bytes - pieces_at) / 2 / n < piece ||
              ((uintptr_t)a->m.seg.buf + (uintptr_t)offset) % 64 != 0 || done_at % 8 != 0;
    if (bad)
        return mapped_refuse(&a->m, "Area");
    a->m.start = (char *)a->m.seg.buf + offset;
    a->m.bytes = bytes;
    a->n = n;
    a->me = me;
    a->header = header;
    a->done_at = done_at;
    a->pieces_at = pieces_at;
    a->piece = piece;
    return 0;
}

/* argument helpers: a call's number, a group rank, its key, a buffer of exact size */

static int live(Area *a) {
    if (a->m.start == NULL) {
        PyErr_SetString(PyExc_ValueError, "minidist.shm._core.Area: released");
        return 0;
    }
    return 1;
}

static int arg_rank(Area *a, PyObject *o, int *out) {
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0 || v >= a->n) {
        PyErr_SetString(PyExc_ValueError, "minidist.shm._core.Area: rank out of range");
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int arg_key(PyObject *o, const char **out) {
    if (!PyBytes_Check(o) || PyBytes_GET_SIZE(o) != KEY) {
        PyErr_SetString(PyExc_ValueError, "minidist.shm._core.Area: a key is 28 bytes");
        return -1;
    }
    *out = PyBytes_AS_STRING(o);
    return 0;
}

static int arg_buf(PyObject *o, Py_buffer *view, Py_ssize_t nbytes, int writable) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(o, view, flags) < 0)
        return -1;
    if (view->len != nbytes) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "minidist.shm._core.Area: %zd bytes where %zd were "
                                       "expected", view->len, nbytes);
        return -1;
    }
    return 0;
}

static int arg_nb(Area *a, PyObject *o, Py_ssize_t *out) {
    Py_ssize_t v = PyLong_AsSsize_t(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0 || v > a->piece) {
        PyErr_SetString(PyExc_ValueError, "minidist.shm._core.Area: more bytes than a piece");
        return -1;
    }
    *out = v;
    return 0;
}

static inline void put_sig(char *head, const char *key, int64_t seq) {
    memcpy(head + 4, key, KEY);
    store64(head + SEQ_AT, seq);
}

/* the first rank whose signature of `parity` is not `key`; -1: none */
static int differing(Area *a, int parity, const char *key) {
    for (int r = 0; r < a->n; r++)
        if (memcmp(head_of(a, r, parity) + 4, key, KEY) != 0)
            return r;
    return -1;
}

/* scatter_root(f, key, seq, src, out, nb): the root's whole role (see
 * minidist.shm.rooted_area.Rooted.scatter_root); nothing to wait for. */
static PyObject *Area_scatter_root(Area *a, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "scatter_root(f, key, seq, src, out, nb)");
        return NULL;
    }
    long long f = PyLong_AsLongLong(args[0]);
    long long seq = PyLong_AsLongLong(args[2]);
    const char *key;
    Py_ssize_t nb;
    if (PyErr_Occurred() || !live(a) || arg_key(args[1], &key) < 0 || arg_nb(a, args[5], &nb) < 0)
        return NULL;
    Py_buffer src, out;
    if (arg_buf(args[3], &src, nb * a->n, 0) < 0)
        return NULL;
    if (arg_buf(args[4], &out, nb, 1) < 0) {
        PyBuffer_Release(&src);
        return NULL;
    }
    int p = (int)(f & 1), me = a->me;
    int32_t number = (int32_t)((f + 1) & 0x7FFFFFFF);
    char *head = head_of(a, me, p);
    const char *s = src.buf;
    if (nb == a->piece)
        memcpy(piece_of(a, p, 0), s, nb * a->n);
    else
        for (int r = 0; r < a->n; r++)
            memcpy(piece_of(a, p, r), s + nb * r, nb);
    put_sig(head, key, seq);
    store32(head, number); /* after the pieces and the signature */
    memcpy(out.buf, s + nb * me, nb);
    store32(head + RELEASE, number);
    fence_full();
    int32_t said = load32(head + SLEEPING_RELEASE);
    if (said && (((uint32_t)(said - number)) & 0x7FFFFFFF) < (1u << 30))
        sys_futex_wake(head + RELEASE);
    PyBuffer_Release(&src);
    PyBuffer_Release(&out);
    Py_RETURN_NONE;
}

/* scatter_recv(f, root, key, seq, out, nb, nap) -> DONE, DIFFER or WAIT_MORE (nothing
 * written: wait on, then call again); done, its done word holds f + 1. */
static PyObject *Area_scatter_recv(Area *a, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "scatter_recv(f, root, key, seq, out, nb, nap)");
        return NULL;
    }
    long long f = PyLong_AsLongLong(args[0]);
    long long seq = PyLong_AsLongLong(args[3]);
    double nap = PyFloat_AsDouble(args[6]);
    int root;
    const char *key;
    Py_ssize_t nb;
    if (PyErr_Occurred() || !live(a) || arg_rank(a, args[1], &root) < 0 ||
        arg_key(args[2], &key) < 0 || arg_nb(a, args[5], &nb) < 0)
        return NULL;
    int p = (int)(f & 1);
    int32_t number = (int32_t)((f + 1) & 0x7FFFFFFF);
    char *head = head_of(a, root, p);
    if (load32(head + RELEASE) != number) {
        int got;
        Py_BEGIN_ALLOW_THREADS
        got = wait_word_nogil((int32_t *)(head + RELEASE), number,
                              (int32_t *)(head + SLEEPING_RELEASE), number, &a->m.pat, nap);
        Py_END_ALLOW_THREADS
        if (!got)
            return PyLong_FromLong(WAIT_MORE);
    }
    Py_buffer out;
    if (arg_buf(args[4], &out, nb, 1) < 0)
        return NULL;
    int differs = memcmp(head + 4, key, KEY) != 0;
    if (!differs)
        memcpy(out.buf, piece_of(a, p, a->me), nb);
    PyBuffer_Release(&out);
    char *at = head_of(a, a->me, p);
    put_sig(at, key, seq);
    store32(at, number); /* after its reads and its signature: for the root's check */
    store64(done_of(a, a->me), f + 1);
    return PyLong_FromLong(differs ? DIFFER : DONE);
}

/* gather_send(f, root, key, seq, src, nb) -> DONE or DIFFER (the root's signature, if
 * it arrived first, is not this rank's); nothing to wait for. */
static PyObject *Area_gather_send(Area *a, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "gather_send(f, root, key, seq, src, nb)");
        return NULL;
    }
    long long f = PyLong_AsLongLong(args[0]);
    long long seq = PyLong_AsLongLong(args[3]);
    int root;
    const char *key;
    Py_ssize_t nb;
    if (PyErr_Occurred() || !live(a) || arg_rank(a, args[1], &root) < 0 ||
        arg_key(args[2], &key) < 0 || arg_nb(a, args[5], &nb) < 0)
        return NULL;
    Py_buffer src;
    if (arg_buf(args[4], &src, nb, 0) < 0)
        return NULL;
    int p = (int)(f & 1), me = a->me;
    int32_t number = (int32_t)((f + 1) & 0x7FFFFFFF);
    char *head = head_of(a, root, p), *at = head_of(a, me, p);
    memcpy(piece_of(a, p, me), src.buf, nb);
    PyBuffer_Release(&src);
    put_sig(at, key, seq);
    int differs = load32(head) == number && memcmp(head + 4, key, KEY) != 0;
    store64(done_of(a, me), f + 1); /* its last load of the call is done */
    store32(at, number);            /* after the piece and the signature */
    /* the last one wakes the root: a locked add (a full fence, as the kernel's
     * FUTEX_WAKE_OP that the pure core uses on the same word), and the wake-up's system
     * call only by the rank whose add completed the count */
    if (__atomic_fetch_add((int32_t *)(head + ARRIVED), 1, __ATOMIC_SEQ_CST) == a->n - 2)
        sys_futex_wake(head + ARRIVED);
    return PyLong_FromLong(differs ? DIFFER : DONE);
}

/* gather_root(f, key, seq, src, out, nb, pending_f, pending_key, nap) ->
 *   (DONE, -1); (DIFFER, rank); (WAIT_MORE, -1): wait on the arrivals, then call again
 *   (what it wrote it writes again, the same); (SETTLE_LATE, -1): arrived, the count set
 *   back, but the pending scatter's receivers did not all store their numbers (the
 *   Python side settles it and finishes the call); (SETTLE_DIFFERS, rank): the pending
 *   scatter was settled and rank called something else.
 * pending_f < 0: no scatter of this rank pending. */
static PyObject *Area_gather_root(Area *a, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "gather_root(f, key, seq, src, out, nb, pending_f, pending_key, nap)");
        return NULL;
    }
    long long f = PyLong_AsLongLong(args[0]);
    long long seq = PyLong_AsLongLong(args[2]);
    long long pf = PyLong_AsLongLong(args[6]);
    double nap = PyFloat_AsDouble(args[8]);
    const char *key, *pkey = NULL;
    Py_ssize_t nb;
    if (PyErr_Occurred() || !live(a) || arg_key(args[1], &key) < 0 || arg_nb(a, args[5], &nb) < 0)
        return NULL;
    if (pf >= 0 && arg_key(args[7], &pkey) < 0)
        return NULL;
    Py_buffer src;
    if (arg_buf(args[3], &src, nb, 0) < 0)
        return NULL;
    int p = (int)(f & 1), me = a->me, n = a->n;
    int32_t number = (int32_t)((f + 1) & 0x7FFFFFFF);
    char *head = head_of(a, me, p);
    memcpy(piece_of(a, p, me), src.buf, nb);
    PyBuffer_Release(&src);
    put_sig(head, key, seq);
    store32(head, number);
    int32_t *arrived = (int32_t *)(head + ARRIVED);
    if (load32(arrived) != n - 1) {
        int got;
        Py_BEGIN_ALLOW_THREADS
        got = wait_word_nogil(arrived, n - 1, NULL, 0, &a->m.pat, nap);
        Py_END_ALLOW_THREADS
        if (!got)
            return Py_BuildValue("(ii)", WAIT_MORE, -1);
    }
    store32(arrived, 0);
    if (pf >= 0) {
        int pp = (int)(pf & 1);
        int32_t pnumber = (int32_t)((pf + 1) & 0x7FFFFFFF);
        for (int r = 0; r < n; r++)
            if (load32(head_of(a, r, pp)) != pnumber)
                return Py_BuildValue("(ii)", SETTLE_LATE, -1);
        int bad = differing(a, pp, pkey);
        store64(done_of(a, me), pf + 1);
        if (bad >= 0)
            return Py_BuildValue("(ii)", SETTLE_DIFFERS, bad);
    }
    int bad = differing(a, p, key);
    if (bad >= 0) {
        store32(head + DIFFERS, number);
        store64(done_of(a, me), f + 1);
        return Py_BuildValue("(ii)", DIFFER, bad);
    }
    Py_buffer out;
    if (arg_buf(args[4], &out, nb * n, 1) < 0)
        return NULL;
    char *o = out.buf;
    if (nb == a->piece)
        memcpy(o, piece_of(a, p, 0), nb * n);
    else
        for (int r = 0; r < n; r++)
            memcpy(o + nb * r, piece_of(a, p, r), nb);
    PyBuffer_Release(&out);
    store64(done_of(a, me), f + 1); /* after the last load of the pieces */
    return Py_BuildValue("(ii)", DONE, -1);
}

/* wait(word_offset, want, flag_offset, flag_value, nap) -> bool: a wait on one of the
 * area's words (offsets in bytes from the area's start; flag_offset < 0: no flag). */
static PyObject *Area_wait(Area *a, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "wait(word, want, flag, flag_value, nap)");
        return NULL;
    }
    Py_ssize_t word = PyLong_AsSsize_t(args[0]), flag = PyLong_AsSsize_t(args[2]);
    long long want = PyLong_AsLongLong(args[1]), fv = PyLong_AsLongLong(args[3]);
    double nap = PyFloat_AsDouble(args[4]);
    if (PyErr_Occurred() || !live(a))
        return NULL;
    if (word < 0 || word % 4 || word + 4 > a->m.bytes || flag % 4 || flag + 4 > a->m.bytes) {
        PyErr_SetString(PyExc_ValueError, "minidist.shm._core.Area.wait: offset out of range");
        return NULL;
    }
    int got;
    int32_t *w = (int32_t *)(a->m.start + word);
    int32_t *fl = flag >= 0 ? (int32_t *)(a->m.start + flag) : NULL;
    Py_BEGIN_ALLOW_THREADS
    got = wait_word_nogil(w, (int32_t)want, fl, (int32_t)fv, &a->m.pat, nap);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(got);
}

static PyMethodDef Area_methods[] = {
    {"scatter_root", (PyCFunction)(void (*)(void))Area_scatter_root, METH_FASTCALL, NULL},
    {"scatter_recv", (PyCFunction)(void (*)(void))Area_scatter_recv, METH_FASTCALL, NULL},
    {"gather_send", (PyCFunction)(void (*)(void))Area_gather_send, METH_FASTCALL, NULL},
    {"gather_root", (PyCFunction)(void (*)(void))Area_gather_root, METH_FASTCALL, NULL},
    {"wait", (PyCFunction)(void (*)(void))Area_wait, METH_FASTCALL, NULL},
    MAPPED_METHODS,
};

static PyTypeObject AreaType = MAPPED_TYPE(
    Area, "A group's rooted area (minidist.shm.rooted_area) run by the compiled core.");

/* ------------------------------------------------------------------ inboxes (p2p) */

/* A rank's inbox (minidist.shm.inbox), mapped by its reader or by a sender: a 64-byte inbox
 * header (OPEN, BELL, SLEEPING), then per ring `ctrl` bytes holding HEAD (int32) and
 * TAIL, then from `data` each ring's `slots` records of `record` bytes, ring by ring.
 * `room`: the bytes of a record a put may write (a sender's reserved pages). */
typedef struct {
    Mapped m; /* start: the inbox's first byte */
    int rings, slots;
    Py_ssize_t header, ctrl, data, record, room, open_at, bell_at, sleeping_at, head_at,
        tail_at;
} Box;

#define WRAP 0x7FFFFFFF

static int Box_init(Box *b, PyObject *args, PyObject *kw) {
    PyObject *buf;
    int rings, slots;
    Py_ssize_t header, ctrl, data, record, open_at, bell_at, sleeping_at, head_at, tail_at;
    static char *names[] = {"buf", "rings", "header", "ctrl", "data", "record", "slots",
                            "open", "bell", "sleeping", "head", "tail", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Oinnnninnnnn", names, &buf, &rings, &header,
                                     &ctrl, &data, &record, &slots, &open_at, &bell_at,
                                     &sleeping_at, &head_at, &tail_at))
        return -1;
    if (mapped_hold(&b->m, buf) < 0)
        return -1;
    int bad = rings < 1 || rings > (1 << 20) || slots < 1 || slots > 64 || header < 64 ||
              record < header || record > (1 << 26) || ctrl < 64 || ctrl > 4096 ||
              data < header + (Py_ssize_t)rings * ctrl ||
              data + (Py_ssize_t)rings * slots * record > b->m.seg.len ||
              open_at < 0 || open_at + 4 > header || bell_at < 0 || bell_at + 4 > header ||
              sleeping_at < 0 || sleeping_at + 4 > header || head_at < 0 ||
              head_at + 4 > ctrl || tail_at < 0 || tail_at + 4 > ctrl ||
              (open_at | bell_at | sleeping_at | head_at | tail_at | header | ctrl | data |
               record) % 4 != 0 || ((uintptr_t)b->m.seg.buf) % 64 != 0;
    if (bad)
        return mapped_refuse(&b->m, "Box");
    b->m.start = b->m.seg.buf;
    b->m.bytes = b->m.seg.len;
    b->rings = rings;
    b->slots = slots;
    b->header = header;
    b->ctrl = ctrl;
    b->data = data;
    b->record = record;
    b->room = record;
    b->open_at = open_at;
    b->bell_at = bell_at;
    b->sleeping_at = sleeping_at;
    b->head_at = head_at;
    b->tail_at = tail_at;
    return 0;
}

/* ring `ring`'s HEAD/TAIL words (*ctl) and, if `recs`, its first record (*recs); the
 * ring is in range and the box not released */
static inline void ring_at(Box *b, int ring, char **ctl, char **recs) {
    *ctl = b->m.start + b->header + (Py_ssize_t)ring * b->ctrl;
    if (recs)
        *recs = b->m.start + b->data + (Py_ssize_t)ring * b->slots * b->record;
}

/* ring `o`'s HEAD/TAIL words (*ctl) and its first record (*recs) */
static int box_ring(Box *b, PyObject *o, char **ctl, char **recs) {
    if (b->m.start == NULL) {
        PyErr_SetString(PyExc_ValueError, "minidist.shm._core.Box: released");
        return -1;
    }
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0 || v >= b->rings) {
        PyErr_SetString(PyExc_ValueError, "minidist.shm._core.Box: ring out of range");
        return -1;
    }
    ring_at(b, (int)v, ctl, recs);
    return 0;
}

/* room(nbytes): a put may write the first `nbytes` bytes of a record (header included),
 * the pages its sender reserved; a longer record is answered 3, unwritten. */
static PyObject *Box_room(Box *b, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1) {
        PyErr_SetString(PyExc_TypeError, "room(nbytes)");
        return NULL;
    }
    Py_ssize_t n = PyLong_AsSsize_t(args[0]);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < b->header || n > b->record) {
        PyErr_SetString(PyExc_ValueError, "minidist.shm._core.Box: room out of range");
        return NULL;
    }
    b->room = n;
    Py_RETURN_NONE;
}

static int box_header(Box *b, PyObject *o, const char **out) {
    if (!PyBytes_Check(o) || PyBytes_GET_SIZE(o) != b->header) {
        PyErr_SetString(PyExc_ValueError, "minidist.shm._core.Box: a record's header is 64 bytes");
        return -1;
    }
    *out = PyBytes_AS_STRING(o);
    return 0;
}

/* Write one record into the ring whose HEAD/TAIL words are at `ring` and records at
 * `recs`: 0 (not written: closed or full), 1 (written), 2 (written, but the inbox closed
 * meanwhile), 3 (not written: longer than the room, see room()). The caller checked that
 * `len` fits a record. */
static int box_put_raw(Box *b, char *ring, char *recs, const char *header, const void *buf,
                       Py_ssize_t len) {
    int32_t *open = (int32_t *)(b->m.start + b->open_at);
    int32_t *tailp = (int32_t *)(ring + b->tail_at);
    int32_t *headp = (int32_t *)(ring + b->head_at);
    if (b->header + len > b->room)
        return 3;
    if (!load32(open))
        return 0;
    int32_t tail = load32(tailp);
    if (((uint32_t)(tail - load32(headp)) & WRAP) >= (uint32_t)b->slots)
        return 0;
    char *at = recs + (Py_ssize_t)(tail % b->slots) * b->record;
    memcpy(at, header, b->header);
    if (len)
        memcpy(at + b->header, buf, len);
    store32(tailp, (tail + 1) & WRAP); /* after the record: a reader sees both */
    fence_full();
    int32_t *sleeping = (int32_t *)(b->m.start + b->sleeping_at);
    if (load32(sleeping)) {
        int32_t *bell = (int32_t *)(b->m.start + b->bell_at);
        store32(sleeping, 0);
        store32(bell, (load32(bell) + 1) & WRAP);
        sys_futex_wake(bell);
    }
    return load32(open) ? 1 : 2;
}

/* put(ring, header, payload) -> 0 (not written: closed or full), 1 (written), 2 (written,
 * but the inbox closed meanwhile), 3 (not written: longer than the room, see room()):
 * minidist.shm.inbox.Outbox.put. payload: a C-contiguous buffer or None. */
static PyObject *Box_put(Box *b, PyObject *const *args, Py_ssize_t nargs) {
    char *ring, *recs;
    const char *header;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "put(ring, header, payload)");
        return NULL;
    }
    if (box_ring(b, args[0], &ring, &recs) < 0 || box_header(b, args[1], &header) < 0)
        return NULL;
    Py_buffer pay;
    int has = args[2] != Py_None;
    if (has) {
        if (PyObject_GetBuffer(args[2], &pay, PyBUF_C_CONTIGUOUS) < 0)
            return NULL;
        if (pay.len > b->record - b->header) {
            PyBuffer_Release(&pay);
            PyErr_SetString(PyExc_ValueError, "minidist.shm._core.Box: a payload larger than "
                                              "a record");
            return NULL;
        }
    }
    long result = box_put_raw(b, ring, recs, header, has ? pay.buf : NULL, has ? pay.len : 0);
    if (has)
        PyBuffer_Release(&pay);
    return PyLong_FromLong(result);
}

/* The oldest record of the ring (`ring`, `recs` as for box_put_raw), if its header is
 * `header`, copied into `into` (`len` bytes, at most a record's payload) and removed:
 * 1; else 0, nothing changed. */
static int box_take_raw(Box *b, char *ring, char *recs, const char *header, void *into,
                        Py_ssize_t len) {
    int32_t *headp = (int32_t *)(ring + b->head_at);
    int32_t head = load32(headp);
    if (load32(ring + b->tail_at) == head)
        return 0;
    char *at = recs + (Py_ssize_t)(head % b->slots) * b->record;
    if (memcmp(at, header, b->header) != 0)
        return 0;
    memcpy(into, at + b->header, len);
    store32(headp, (head + 1) & WRAP); /* after the copy */
    return 1;
}

/* take_if(ring, header, into) -> bool: the oldest record of the ring, if its header is
 * `header`, copied into `into` (a writable C-contiguous buffer of the payload's size)
 * and removed: minidist.shm.inbox.Inbox.take_if. */
static PyObject *Box_take_if(Box *b, PyObject *const *args, Py_ssize_t nargs) {
    char *ring, *recs;
    const char *header;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "take_if(ring, header, into)");
        return NULL;
    }
    if (box_ring(b, args[0], &ring, &recs) < 0 || box_header(b, args[1], &header) < 0)
        return NULL;
    Py_buffer into;
    if (PyObject_GetBuffer(args[2], &into, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return NULL;
    if (into.len > b->record - b->header) {
        PyBuffer_Release(&into);
        PyErr_SetString(PyExc_ValueError, "minidist.shm._core.Box: more bytes than a record");
        return NULL;
    }
    int took = box_take_raw(b, ring, recs, header, into.buf, into.len);
    PyBuffer_Release(&into);
    return PyBool_FromLong(took);
}

typedef struct {
    int32_t *head, *tail, *bell;
    int32_t seen;
} ring_news_t;

/* whether a ring holds a record, or its inbox's bell moved from what the waiter saw */
static int ring_news(const void *ctx) {
    const ring_news_t *r = ctx;
    return load32(r->tail) != load32(r->head) || load32(r->bell) != r->seen;
}

/* Until the ring (HEAD/TAIL words at `ring`) holds a record (1) or the bell moved from
 * `seen` or `nap` seconds passed (0); spins or yields, then sleeps on the bell saying so
 * (minidist.shm.inbox.Inbox.will_sleep / sleep). Releases the GIL. */
static int box_wait_raw(Box *b, char *ring, int32_t seen, double nap) {
    ring_news_t news = {(int32_t *)(ring + b->head_at), (int32_t *)(ring + b->tail_at),
                        (int32_t *)(b->m.start + b->bell_at), seen};
    int32_t *sleeping = (int32_t *)(b->m.start + b->sleeping_at);
    int got;
    Py_BEGIN_ALLOW_THREADS
    if (!ring_news(&news) && !patient(&b->m.pat, ring_news, &news) && nap > 0) {
        store32(sleeping, 1);
        fence_full();
        if (!ring_news(&news))
            sys_futex_wait(news.bell, seen, nap);
        store32(sleeping, 0);
    }
    got = load32(news.tail) != load32(news.head);
    Py_END_ALLOW_THREADS
    return got;
}

/* wait(ring, seen, nap) -> bool: box_wait_raw. */
static PyObject *Box_wait(Box *b, PyObject *const *args, Py_ssize_t nargs) {
    char *ring;
    int32_t seen;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "wait(ring, seen, nap)");
        return NULL;
    }
    if (box_ring(b, args[0], &ring, NULL) < 0 || as_i32(args[1], &seen) < 0)
        return NULL;
    double nap = PyFloat_AsDouble(args[2]);
    if (nap == -1.0 && PyErr_Occurred())
        return NULL;
    return PyBool_FromLong(box_wait_raw(b, ring, seen, nap));
}

static PyMethodDef Box_methods[] = {
    {"put", (PyCFunction)(void (*)(void))Box_put, METH_FASTCALL, NULL},
    {"take_if", (PyCFunction)(void (*)(void))Box_take_if, METH_FASTCALL, NULL},
    {"wait", (PyCFunction)(void (*)(void))Box_wait, METH_FASTCALL, NULL},
    {"room", (PyCFunction)(void (*)(void))Box_room, METH_FASTCALL, NULL},
    MAPPED_METHODS,
};

static PyTypeObject BoxType = MAPPED_TYPE(
    Box, "A rank's inbox (minidist.shm.inbox), its rings run by the compiled core.");

/* ------------------------------------------------------------------ repeated calls' checks */

/* attribute names, interned at the module's start */
static PyObject *s_default, *s_dtype, *s_shape, *s_lost, *s_left, *s_rendezvous_lost,
    *s_acquire, *s_release, *s_inbox, *s_waiting, *s_early, *s_is_dead, *s_p2p_waiting,
    *s_call_soon_threadsafe, *s_p2p_seqs, *s_aborted, *s_broken, *s_died, *s_gave_up,
    *s_pending, *s_last, *s_behind, *s_turn_done, *s_slots;

/* Whether o.name is None (1), not (0), or -1 on an error. */
static int attr_is_none(PyObject *o, PyObject *name) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL)
        return -1;
    Py_DECREF(v);
    return v == Py_None;
}

/* Whether o.name is true (1), false (0), or -1 on an error. */
static int attr_true(PyObject *o, PyObject *name) {
    PyObject *v = PyObject_GetAttr(o, name);
    if (v == NULL)
        return -1;
    int t = PyObject_IsTrue(v);
    Py_DECREF(v);
    return t;
}

/* table[key] += 1 (a mapping; a missing key counts from 0 if `from_zero`): the old value,
 * or -1 on an error. */
static long long count_up(PyObject *table, PyObject *key, int from_zero) {
    PyObject *v = PyObject_GetItem(table, key);
    long long n = 0;
    if (v == NULL) {
        if (!from_zero || !PyErr_ExceptionMatches(PyExc_KeyError))
            return -1;
        PyErr_Clear();
    } else {
        n = PyLong_AsLongLong(v);
        Py_DECREF(v);
        if (n < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "minidist.shm._core: a negative number");
            return -1;
        }
    }
    PyObject *next = PyLong_FromLongLong(n + 1);
    if (next == NULL || PyObject_SetItem(table, key, next) < 0) {
        Py_XDECREF(next);
        return -1;
    }
    Py_DECREF(next);
    return n;
}

/* Whether `g` is `planner.default` (1), not (0), or -1 on an error. */
static int is_default_group(PyObject *planner, PyObject *g) {
    PyObject *d = PyObject_GetAttr(planner, s_default);
    if (d == NULL)
        return -1;
    Py_DECREF(d);
    return d == g;
}

/* Whether `arr` is an array of exactly type `ndarray`, of dtype `dtype` (the same
 * object), of `shape`, C-contiguous (and `writable`) and `nbytes` long: 1, with `view`
 * held; 0, nothing held and no error set (the general path says what is wrong); -1. */
static int array_view(PyObject *arr, PyObject *ndarray, PyObject *dtype, PyObject *shape,
                      Py_ssize_t nbytes, int writable, Py_buffer *view) {
    if (Py_TYPE(arr) != (PyTypeObject *)ndarray)
        return 0;
    PyObject *d = PyObject_GetAttr(arr, s_dtype);
    if (d == NULL)
        return -1;
    Py_DECREF(d);
    if (d != dtype)
        return 0;
    PyObject *got = PyObject_GetAttr(arr, s_shape);
    if (got == NULL)
        return -1;
    int same = PyObject_RichCompareBool(got, shape, Py_EQ);
    Py_DECREF(got);
    if (same <= 0)
        return same;
    if (PyObject_GetBuffer(arr, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) <
        0) {
        PyErr_Clear(); /* not C-contiguous, or not writable */
        return 0;
    }
    if (view->len != nbytes) {
        PyBuffer_Release(view);
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------ repeated messages */

/* A Lane is one repeated point-to-point message, planned once by Python
 * (minidist.shm.routes for sends, minidist.shm.takes for receives): the same group,
 * peer, tag, dtype and shape, through one ring of one inbox. A call checks the caller's
 * arguments against it, numbers the message in the engine's table (the one the general
 * path numbers in), and puts or takes the record in one C call. Whatever it does not
 * handle it hands back to Python untouched, or numbered (a receive that must wait
 * longer), as minidist.shm.routes and minidist.shm.takes say. The GIL is held from the
 * numbering to the put or take, except in a receive's wait, so no Python thread runs
 * between them. */
typedef struct {
    PyObject_HEAD
    Box *box;
    int ring, receives;
    char header[64]; /* the message's header; its number goes at P2P_SEQ_AT */
    PyObject *group, *planner, *ndarray, *dtype, *shape, *engine, *key, *peer;
    PyObject *lock;   /* a send's: the send lock; a receive's: the receiver lock */
    PyObject *holder; /* a send's: the mapped inboxes by receiver; a receive's: FastP2P */
    PyObject *owner;  /* the Outbox (send) or Inbox (receive) the lane was made for */
    PyObject *mailbox, *drain_lock, *loop, *drain; /* a receive's */
    Py_ssize_t nbytes;
    double nap;
    long long count;
} Lane;

#define P2P_SEQ_AT 16 /* a message header's number (int64, minidist.wire) */


static int Lane_init(Lane *l, PyObject *args, PyObject *kw) {
    PyObject *box, *header, *extra = Py_None, *o[10], *r[5] = {NULL, NULL, NULL, NULL, NULL};
    int ring, receives;
    Py_ssize_t nbytes;
    double nap;
    if (kw != NULL && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "Lane() takes positional arguments");
        return -1;
    }
    /* box, ring, header, group, planner, ndarray, dtype, shape, nbytes, engine, key, peer,
     * lock, holder, receives, nap, extra: a send's Outbox, or a receive's (Inbox,
     * mailbox, drain lock, loop, drain) */
    if (!PyArg_ParseTuple(args, "O!iSOOOOOnOOOOOpd|O", &BoxType, &box, &ring, &header, &o[0],
                          &o[1], &o[2], &o[3], &o[4], &nbytes, &o[5], &o[6], &o[7], &o[8],
                          &o[9], &receives, &nap, &extra))
        return -1;
    Box *b = (Box *)box;
    if (b->m.start == NULL || ring < 0 || ring >= b->rings || PyBytes_GET_SIZE(header) != 64 ||
        b->header != 64 || nbytes < 0 || nbytes > b->record - b->header ||
        !PyType_Check(o[2]) || !PyTuple_Check(o[4]) || !PyTuple_Check(o[6]) || l->group != NULL) {
        PyErr_SetString(PyExc_ValueError, "minidist.shm._core.Lane: a lane that does not fit");
        return -1;
    }
    if (receives) {
        if (!PyArg_ParseTuple(extra, "OOOOO", &r[0], &r[1], &r[2], &r[3], &r[4]))
            return -1;
    } else {
        r[0] = extra;
    }
    PyObject **fields[] = {&l->group, &l->planner, &l->ndarray, &l->dtype, &l->shape,
                           &l->engine, &l->key, &l->peer, &l->lock, &l->holder};
    for (int i = 0; i < 10; i++)
        *fields[i] = Py_NewRef(o[i]);
    PyObject **more[] = {&l->owner, &l->mailbox, &l->drain_lock, &l->loop, &l->drain};
    for (int i = 0; i < 5; i++)
        *more[i] = Py_XNewRef(r[i]);
    l->box = (Box *)Py_NewRef(box);
    l->ring = ring;
    l->receives = receives;
    l->nbytes = nbytes;
    l->nap = nap;
    memcpy(l->header, PyBytes_AS_STRING(header), 64);
    return 0;
}

static void Lane_dealloc(Lane *l) {
    Py_XDECREF(l->box);
    Py_XDECREF(l->group);
    Py_XDECREF(l->planner);
    Py_XDECREF(l->ndarray);
    Py_XDECREF(l->dtype);
    Py_XDECREF(l->shape);
    Py_XDECREF(l->engine);
    Py_XDECREF(l->key);
    Py_XDECREF(l->peer);
    Py_XDECREF(l->lock);
    Py_XDECREF(l->holder);
    Py_XDECREF(l->owner);
    Py_XDECREF(l->mailbox);
    Py_XDECREF(l->drain_lock);
    Py_XDECREF(l->loop);
    Py_XDECREF(l->drain);
    Py_TYPE(l)->tp_free((PyObject *)l);
}

/* Whether `array` and `group` are this lane's message (1, `view` then held), not (0,
 * nothing held, no error set: the general path says what is wrong), or -1 (an error). */
static int lane_fits(Lane *l, PyObject *array, PyObject *group, Py_buffer *view) {
    if (l->box == NULL)
        return 0;
    int fits = group == Py_None ? is_default_group(l->planner, l->group)
                                : group == l->group;
    if (fits <= 0)
        return fits;
    return array_view(array, l->ndarray, l->dtype, l->shape, l->nbytes, l->receives, view);
}

/* Whether the peer died or left, or the rendezvous is lost (1), or not (0), or -1. */
static int lane_peer_gone(Lane *l) {
    int there = attr_is_none(l->engine, s_rendezvous_lost);
    if (there != 1)
        return there < 0 ? -1 : 1;
    PyObject *names[2] = {s_lost, s_left};
    for (int i = 0; i < 2; i++) {
        PyObject *set = PyObject_GetAttr(l->engine, names[i]);
        if (set == NULL)
            return -1;
        int in = PySequence_Contains(set, l->peer);
        Py_DECREF(set);
        if (in != 0)
            return in;
    }
    return 0;
}

/* lock.acquire(blocking): 1 if acquired, 0 if not, -1 on an error */
static int lane_acquire(PyObject *lock, int blocking) {
    PyObject *got = PyObject_CallMethodOneArg(lock, s_acquire, blocking ? Py_True : Py_False);
    if (got == NULL)
        return -1;
    int ok = PyObject_IsTrue(got);
    Py_DECREF(got);
    return ok;
}

static int lane_release(PyObject *lock) {
    PyObject *r = PyObject_CallMethodNoArgs(lock, s_release);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* The next number of the lane's (group, peer, tag, direction) in the engine's table,
 * counted there (-1 on an error). */
static long long lane_number(Lane *l, PyObject **seqs) {
    *seqs = PyObject_GetAttr(l->engine, s_p2p_seqs);
    if (*seqs == NULL)
        return -1;
    if (!PyDict_CheckExact(*seqs)) { /* (a plain dict runs no Python code: see the type) */
        PyErr_SetString(PyExc_TypeError, "minidist.shm._core.Lane: the engine's numbers");
        Py_CLEAR(*seqs);
        return -1;
    }
    long long seq = count_up(*seqs, l->key, 1);
    if (seq < 0)
        Py_CLEAR(*seqs);
    return seq;
}

/* The number `seq` back to the table (the message went nowhere), if it was the last. */
static void lane_unnumber(Lane *l, PyObject *seqs, long long seq) {
    PyObject *v = PyDict_GetItemWithError(seqs, l->key);
    if (v != NULL && PyLong_AsLongLong(v) == seq + 1) {
        PyObject *back = PyLong_FromLongLong(seq);
        if (back == NULL || PyDict_SetItem(seqs, l->key, back) < 0)
            PyErr_Clear();
        Py_XDECREF(back);
    }
    PyErr_Clear();
}

/* send(array, group) -> True (written into the receiver's ring), 2 (written, but the
 * inbox closed meanwhile: ring its doorbell) or None (nothing done, not numbered: the
 * general path sends it). minidist.shm.routes.Routes.send_again in one call. */
static PyObject *Lane_send(Lane *l, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || l->receives) {
        PyErr_SetString(PyExc_TypeError, "send(array, group) on a sending lane");
        return NULL;
    }
    Py_buffer view;
    int fits = lane_fits(l, args[0], args[1], &view);
    if (fits <= 0)
        return fits < 0 ? NULL : Py_NewRef(Py_None);
    int gone = lane_peer_gone(l);
    if (gone != 0) {
        PyBuffer_Release(&view);
        return gone < 0 ? NULL : Py_NewRef(Py_None);
    }
    int locked = lane_acquire(l->lock, 0);
    if (locked <= 0) {
        PyBuffer_Release(&view);
        return locked < 0 ? NULL : Py_NewRef(Py_None);
    }
    long result = 0;
    PyObject *seqs = NULL;
    PyObject *out = PyDict_GetItemWithError(l->holder, l->peer);
    Box *b = l->box;
    if (out == l->owner && b != NULL && b->m.start != NULL) {
        long long seq = lane_number(l, &seqs);
        if (seq < 0) {
            result = -1;
        } else {
            char header[64];
            memcpy(header, l->header, 64);
            memcpy(header + P2P_SEQ_AT, &seq, 8);
            char *ring, *recs;
            ring_at(b, l->ring, &ring, &recs);
            result = box_put_raw(b, ring, recs, header, view.buf, view.len);
            if (result == 0 || result == 3) {
                lane_unnumber(l, seqs, seq);
                result = 0;
            }
        }
    } else if (PyErr_Occurred()) {
        result = -1;
    }
    Py_XDECREF(seqs);
    PyBuffer_Release(&view);
    if (result < 0) {
        PyObject *t, *v, *tb;
        PyErr_Fetch(&t, &v, &tb);
        lane_release(l->lock);
        PyErr_Restore(t, v, tb);
        return NULL;
    }
    if (lane_release(l->lock) < 0)
        return NULL;
    if (result == 0)
        Py_RETURN_NONE;
    l->count++;
    if (result == 1)
        Py_RETURN_TRUE;
    return PyLong_FromLong(result);
}

/* After a receive in the inbox (as minidist.shm.p2p.FastP2P.in_inbox ends one): the
 * receiver waits no more; receives on the loop, if any, get the rings. */
static int lane_leave_inbox(Lane *l) {
    if (PyObject_SetAttr(l->holder, s_waiting, Py_False) < 0)
        return -1;
    PyObject *w = PyObject_CallMethodNoArgs(l->mailbox, s_p2p_waiting);
    if (w == NULL)
        return -1;
    int yes = PyObject_IsTrue(w);
    Py_DECREF(w);
    if (yes > 0) {
        PyObject *r = PyObject_CallMethodOneArg(l->loop, s_call_soon_threadsafe, l->drain);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return yes < 0 ? -1 : 0;
}

/* Whether the receiver may sleep in the inbox: nothing came through the socket early,
 * the rendezvous is there, the sender is not known dead (1; 0; -1 on an error). */
static int lane_may_sleep(Lane *l) {
    int some = attr_true(l->mailbox, s_early);
    if (some != 0)
        return some < 0 ? -1 : 0;
    int there = attr_is_none(l->engine, s_rendezvous_lost);
    if (there != 1)
        return there;
    PyObject *dead = PyObject_CallMethodOneArg(l->mailbox, s_is_dead, l->peer);
    if (dead == NULL)
        return -1;
    Py_DECREF(dead);
    return dead == Py_None;
}

/* recv(array, group) -> True (the message is in `array`), None (nothing done, not
 * numbered: the general path receives it) or its number (an int: it was not there
 * within a slice; the general receive takes it on with that number).
 * minidist.shm.takes.Takes.recv_again in one call. */
static PyObject *Lane_recv(Lane *l, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !l->receives) {
        PyErr_SetString(PyExc_TypeError, "recv(array, group) on a receiving lane");
        return NULL;
    }
    Py_buffer view;
    int fits = lane_fits(l, args[0], args[1], &view);
    if (fits <= 0)
        return fits < 0 ? NULL : Py_NewRef(Py_None);
    PyObject *inbox = PyObject_GetAttr(l->holder, s_inbox);
    if (inbox == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_DECREF(inbox);
    Box *b = l->box;
    int locked = inbox == l->owner && b != NULL && b->m.start != NULL ? lane_acquire(l->lock, 0) : 0;
    if (locked <= 0) {
        PyBuffer_Release(&view);
        return locked < 0 ? NULL : Py_NewRef(Py_None);
    }
    Py_INCREF(b); /* (drop() from another thread while this one waits) */
    PyObject *seqs = NULL;
    long long seq = -1;
    int took = -1;
    if (PyObject_SetAttr(l->holder, s_waiting, Py_True) == 0 &&
        (seq = lane_number(l, &seqs)) >= 0) {
        char header[64];
        memcpy(header, l->header, 64);
        memcpy(header + P2P_SEQ_AT, &seq, 8);
        char *ring, *recs;
        ring_at(b, l->ring, &ring, &recs);
        store32(b->m.start + b->open_at, 1); /* Inbox.set_open(True) */
        int32_t seen = load32(b->m.start + b->bell_at);
        int sleep = lane_may_sleep(l);
        if (sleep >= 0) {
            if (sleep)
                box_wait_raw(b, ring, seen, l->nap);
            took = 0;
            if (load32(ring + b->tail_at) != load32(ring + b->head_at)) {
                /* the loop may move the rings' records meanwhile */
                int drained = lane_acquire(l->drain_lock, 1);
                if (drained < 0) {
                    took = -1;
                } else {
                    PyObject *now = PyObject_GetAttr(l->holder, s_inbox);
                    if (now == NULL) {
                        took = -1;
                    } else {
                        Py_DECREF(now);
                        if (now == l->owner && b->m.start != NULL)
                            took = box_take_raw(b, ring, recs, header, view.buf, view.len);
                    }
                    if (lane_release(l->drain_lock) < 0)
                        took = -1;
                }
            }
        }
    }
    PyBuffer_Release(&view);
    PyObject *t = NULL, *v = NULL, *tb = NULL;
    if (took < 0) {
        PyErr_Fetch(&t, &v, &tb);
        if (seqs != NULL)
            lane_unnumber(l, seqs, seq); /* an error: this receive took nothing */
    }
    Py_XDECREF(seqs);
    Py_DECREF(b);
    int left = lane_leave_inbox(l);
    if (lane_release(l->lock) < 0 || left < 0) {
        if (took >= 0) {
            PyErr_Fetch(&t, &v, &tb);
            took = -1;
        } else {
            PyErr_Clear();
        }
    }
    if (took < 0) {
        PyErr_Restore(t, v, tb);
        return NULL;
    }
    if (took) {
        l->count++;
        Py_RETURN_TRUE;
    }
    return PyLong_FromLongLong(seq);
}

/* drop(): never carry a message again (its inbox closed, its peer restarted). */
static PyObject *Lane_drop(Lane *l, PyObject *unused) {
    (void)unused;
    Py_CLEAR(l->box);
    Py_RETURN_NONE;
}

static PyObject *Lane_get_count(Lane *l, void *unused) {
    (void)unused;
    return PyLong_FromLongLong(l->count);
}

static PyGetSetDef Lane_getset[] = {
    {"count", (getter)Lane_get_count, NULL, "messages this lane carried", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Lane_methods[] = {
    {"send", (PyCFunction)(void (*)(void))Lane_send, METH_FASTCALL, NULL},
    {"recv", (PyCFunction)(void (*)(void))Lane_recv, METH_FASTCALL, NULL},
    {"drop", (PyCFunction)Lane_drop, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "minidist.shm._core.Lane",
    .tp_basicsize = sizeof(Lane), .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One repeated message through an inbox's ring (minidist.shm.routes, "
              "minidist.shm.takes), sent or taken in one call.",
    .tp_new = PyType_GenericNew, .tp_init = (initproc)Lane_init,
    .tp_dealloc = (destructor)Lane_dealloc, .tp_methods = Lane_methods,
    .tp_getset = Lane_getset,
};

/* ------------------------------------------------------------------ repeated rooted calls */

/* A Step is a worker's (not the root's) repeated scatter or gather, planned once by
 * Python (minidist.shm.repeat): the same group, root, dtype and shape through the
 * group's rooted area. One call checks the caller's arguments, numbers the call (the
 * group's fast-call number and call number, in the planner's and the engine's tables),
 * looks at what would make the call unusual (minidist.shm.repeat.Repeat._unusual, the
 * engine's may_refuse), and runs the role (Area_scatter_recv or Area_gather_send) and
 * its book-keeping. What it does not finish it hands back to Python: untouched (None),
 * or numbered with how far it got, as minidist.shm.repeat says. */
typedef struct {
    PyObject_HEAD
    Area *area;
    int scatter, writable;
    long root, kind_code, groot_code;
    Py_ssize_t nbytes;
    PyObject *kind, *group_arg, *g, *planner, *ndarray, *dtype, *shape, *key, *groot, *gid,
        *numbers, *entered, *turns, *engine, *fast, *rooted, *slots, *calls, *nb, *nap;
    long long f, seq; /* the call numbered by the last run (f < 0: it numbered none) */
    /* the group's fast slots (fast.slots): with the rooted area, whose gave_up words
     * fast.gave_up reads */
    PyObject *fslots;
    /* failed(f, seq, exc), called when a run raises after numbering its call (None:
     * nobody is told) */
    PyObject *failed;
    /* the root's step: the shape of its other array (a scatter's input, a
     * gather's output; `shape` is the first's) and how a call is made for its
     * pending scatter (minidist.shm.repeat.Repeat._call) */
    int is_root;
    PyObject *in_shape, *make_call;
} Step;

#define K_SCATTER 8
#define K_ALL_GATHER 5

static int Step_init(Step *s, PyObject *args, PyObject *kw) {
    PyObject *area, *o[18];
    int scatter, writable;
    long root;
    Py_ssize_t nbytes;
    double nap;
    if (kw != NULL && PyDict_GET_SIZE(kw)) {
        PyErr_SetString(PyExc_TypeError, "Step() takes positional arguments");
        return -1;
    }
    /* area, scatter, writable, root, nbytes, nap, kind, group_arg, g, planner, ndarray,
     * dtype, shape, key, groot, gid, numbers, entered, turns, engine, fast, rooted, slots,
     * calls */
    PyObject *root_extra = NULL, *in_shape = NULL, *make_call = NULL;
    if (!PyArg_ParseTuple(args, "O!pplndOOOOOOOSOOOOOOOOOO|O", &AreaType, &area, &scatter,
                          &writable, &root, &nbytes, &nap, &o[0], &o[1], &o[2], &o[3], &o[4],
                          &o[5], &o[6], &o[7], &o[8], &o[9], &o[10], &o[11], &o[12], &o[13],
                          &o[14], &o[15], &o[16], &o[17], &root_extra))
        return -1;
    /* the root's step: (its other array's shape, the maker of a call from its number) */
    if (root_extra != NULL &&
        (!PyArg_ParseTuple(root_extra, "O!O", &PyTuple_Type, &in_shape, &make_call) ||
         !PyCallable_Check(make_call))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "minidist.shm._core.Step: (in_shape, make_call)");
        return -1;
    }
    Area *a = (Area *)area;
    long kind = PyLong_AsLong(o[0]);
    long groot = PyLong_AsLong(o[8]);
    if ((kind == -1 || groot == -1) && PyErr_Occurred())
        return -1;
    if (a->m.start == NULL || s->kind != NULL || nbytes < 0 || nbytes > a->piece ||
        groot < 0 || groot >= a->n || (groot == a->me) != (root_extra != NULL) ||
        PyBytes_GET_SIZE(o[7]) != KEY ||
        !PyType_Check(o[4]) || !PyTuple_Check(o[6]) || !PyDict_Check(o[10]) ||
        !PyDict_Check(o[12]) || !PyDict_Check(o[16])) {
        PyErr_SetString(PyExc_ValueError, "minidist.shm._core.Step: a step that does not fit");
        return -1;
    }
    s->nb = PyLong_FromSsize_t(nbytes);
    s->nap = PyFloat_FromDouble(nap);
    if (s->nb == NULL || s->nap == NULL)
        return -1;
    PyObject **fields[] = {&s->kind, &s->group_arg, &s->g, &s->planner, &s->ndarray,
                           &s->dtype, &s->shape, &s->key, &s->groot, &s->gid, &s->numbers,
                           &s->entered, &s->turns, &s->engine, &s->fast, &s->rooted,
                           &s->slots, &s->calls};
    for (int i = 0; i < 18; i++)
        *fields[i] = Py_NewRef(o[i]);
    s->fslots = PyObject_GetAttr(s->fast, s_slots);
    if (s->fslots == NULL)
        return -1;
    s->failed = Py_NewRef(Py_None);
    s->area = (Area *)Py_NewRef(area);
    s->scatter = scatter;
    s->writable = writable;
    s->root = root;
    s->kind_code = kind;
    s->groot_code = groot;
    s->nbytes = nbytes;
    s->f = s->seq = -1;
    s->is_root = root_extra != NULL;
    s->in_shape = Py_XNewRef(in_shape);
    s->make_call = Py_XNewRef(make_call);
    return 0;
}

static void Step_dealloc(Step *s) {
    Py_XDECREF(s->area);
    PyObject *fields[] = {s->kind, s->group_arg, s->g, s->planner, s->ndarray, s->dtype,
                          s->shape, s->key, s->groot, s->gid, s->numbers, s->entered,
                          s->turns, s->engine, s->fast, s->rooted, s->slots, s->calls,
                          s->nb, s->nap, s->in_shape, s->make_call, s->fslots,
                          s->failed};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        Py_XDECREF(fields[i]);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* Whether a call with `root` and `group` is the step's call again: 1, 0 (no error set)
 * or -1. */
static int step_call_fits(Step *s, PyObject *root, PyObject *group) {
    if (s->area->m.start == NULL || group != s->group_arg || !PyLong_CheckExact(root))
        return 0;
    int overflow;
    if (PyLong_AsLongAndOverflow(root, &overflow) != s->root || overflow)
        return 0;
    return group == Py_None ? is_default_group(s->planner, s->g) : 1;
}

/* Whether `arr` is a C-contiguous (and `writable`) array of the step's dtype, of
 * `shape`, `nbytes` long: 1, 0 (no error set) or -1. */
static int step_array_fits(Step *s, PyObject *arr, PyObject *shape, Py_ssize_t nbytes,
                           int writable) {
    Py_buffer view;
    int fits = array_view(arr, s->ndarray, s->dtype, shape, nbytes, writable, &view);
    if (fits > 0)
        PyBuffer_Release(&view);
    return fits;
}

/* Whether call f must take Python's general run (1; 0; -1): another call's turn, an
 * error or abort known (Engine.may_refuse), the group gave up, a scatter pending, the
 * group's segment changed. */
static int step_unusual(Step *s, long long f, int pending_ok) {
    PyObject *turn = PyDict_GetItemWithError(s->turns, s->gid);
    if (turn == NULL && PyErr_Occurred())
        return -1;
    long long t = turn == NULL ? 0 : PyLong_AsLongLong(turn);
    if (t == -1 && PyErr_Occurred())
        return -1;
    if (t != f)
        return 1;
    int r = attr_is_none(s->engine, s_rendezvous_lost);
    if (r != 1)
        return r < 0 ? -1 : 1;
    PyObject *names[] = {s_aborted, s_broken, s_lost, s_died};
    for (int i = 0; i < 4; i++) {
        r = attr_true(s->engine, names[i]);
        if (r != 0)
            return r;
    }
    /* fast.gave_up (a property) read without its Python frame */
    if ((r = attr_is_none(s->rooted, s_gave_up)) != 1 ||
        (r = attr_is_none(s->fslots, s_gave_up)) != 1 ||
        (!pending_ok && (r = attr_is_none(s->rooted, s_pending)) != 1))
        return r < 0 ? -1 : 1;
    PyObject *fast = PyDict_GetItemWithError(s->slots, s->gid);
    if (fast == NULL && PyErr_Occurred())
        return -1;
    return fast != s->fast;
}

/* Whether whoever read what this call overwrites finished reading it in `last`, the
 * area's previous call of this parity (minidist.shm.rooted_area.Rooted.reused): 1, 0, -1. */
static int step_reused(Step *s, Area *a, PyObject *last) {
    if (last == Py_None)
        return 1;
    if (!PyTuple_Check(last) || PyTuple_GET_SIZE(last) != 3) {
        PyErr_SetString(PyExc_TypeError, "minidist.shm._core.Step: the area's last call");
        return -1;
    }
    long long lf = PyLong_AsLongLong(PyTuple_GET_ITEM(last, 0));
    long lkind = PyLong_AsLong(PyTuple_GET_ITEM(last, 1));
    long lroot = PyLong_AsLong(PyTuple_GET_ITEM(last, 2));
    if (PyErr_Occurred())
        return -1;
    long me = a->me, root = s->groot_code;
    if (lroot < 0 || lroot >= a->n) {
        PyErr_SetString(PyExc_ValueError, "minidist.shm._core.Step: the area's last root");
        return -1;
    }
    if (lkind == K_SCATTER && s->kind_code == K_SCATTER) {
        if (lroot == root && root != me)
            return 1;
        if (lroot != me && root != me)
            return __atomic_load_n(done_of(a, (int)lroot), __ATOMIC_ACQUIRE) > lf;
    } else if (lkind != K_ALL_GATHER && lroot != me) {
        return __atomic_load_n(done_of(a, (int)lroot), __ATOMIC_ACQUIRE) > lf;
    }
    for (int r = 0; r < a->n; r++)
        if (__atomic_load_n(done_of(a, r), __ATOMIC_ACQUIRE) <= lf)
            return 0;
    return 1;
}

static PyObject *Area_scatter_recv(Area *a, PyObject *const *args, Py_ssize_t nargs);
static PyObject *Area_gather_send(Area *a, PyObject *const *args, Py_ssize_t nargs);

/* The area for call (f, seq), if whoever read what it overwrites is done (step_reused):
 * the area's last call of its parity becomes this one, and *fo, *so its numbers as
 * objects (1); 0 if the area is still being read (nothing changed); -1 on an error. */
static int step_take_area(Step *s, Area *area, long long f, long long seq, PyObject **fo,
                          PyObject **so) {
    PyObject *last_list = PyObject_GetAttr(s->rooted, s_last), *now = NULL;
    int taken = -1;
    if (last_list == NULL)
        return -1;
    if (!PyList_Check(last_list) || PyList_GET_SIZE(last_list) != 2) {
        PyErr_SetString(PyExc_TypeError, "minidist.shm._core.Step: the area's last calls");
        goto done;
    }
    int reused = step_reused(s, area, PyList_GET_ITEM(last_list, f & 1));
    if (reused <= 0) {
        taken = reused;
        goto done;
    }
    *fo = PyLong_FromLongLong(f);
    *so = PyLong_FromLongLong(seq);
    if (*fo == NULL || *so == NULL)
        goto done;
    now = PyTuple_Pack(3, *fo, s->kind, s->groot);
    if (now != NULL && PyList_SetItem(last_list, f & 1, Py_NewRef(now)) == 0)
        taken = 1;
done:
    Py_DECREF(last_list);
    Py_XDECREF(now);
    return taken;
}

/* Call f is done here: the group's next call's turn (FastCalls.turn_done). 0, or -1. */
static int step_pass_turn(Step *s, long long f) {
    PyObject *next = PyLong_FromLongLong(f + 1);
    int failed = next == NULL || PyDict_SetItem(s->turns, s->gid, next) < 0;
    if (!failed) {
        int waiting = attr_true(s->calls, s_waiting);
        if (waiting > 0) {
            PyObject *r = PyObject_CallMethodObjArgs(s->calls, s_turn_done, s->gid, next, NULL);
            Py_XDECREF(r);
            failed = r == NULL;
        } else {
            failed = waiting < 0;
        }
    }
    Py_XDECREF(next);
    return failed ? -1 : 0;
}

/* Run the call numbered (f, seq) with `arr`: True, or (f, seq, how) (see run). */
static PyObject *step_go(Step *s, Area *area, PyObject *arr, long long f, long long seq) {
    long how = -1;
    int unusual = step_unusual(s, f, 0);
    if (unusual < 0)
        return NULL;
    PyObject *fo = NULL, *so = NULL, *result = NULL;
    int taken = unusual ? 0 : step_take_area(s, area, f, seq, &fo, &so);
    if (taken < 0)
        goto done;
    if (taken) {
        PyObject *got;
        if (s->scatter) {
            PyObject *a[7] = {fo, s->groot, s->key, so, arr, s->nb, s->nap};
            got = Area_scatter_recv(area, a, 7);
        } else {
            PyObject *a[6] = {fo, s->groot, s->key, so, arr, s->nb};
            got = Area_gather_send(area, a, 6);
        }
        if (got == NULL)
            goto done;
        how = PyLong_AsLong(got);
        Py_DECREF(got);
        if (how == -1 && PyErr_Occurred())
            goto done;
    }
    if (how == DONE) {
        PyObject *behind = PyTuple_Pack(2, fo, s->groot);
        int failed = behind == NULL || PyObject_SetAttr(s->rooted, s_behind, behind) < 0 ||
                     step_pass_turn(s, f) < 0;
        Py_XDECREF(behind);
        if (!failed)
            result = Py_NewRef(Py_True);
    } else {
        result = Py_BuildValue("(LLl)", f, seq, how);
    }
done:
    Py_XDECREF(fo);
    Py_XDECREF(so);
    return result;
}

static PyObject *Area_scatter_root(Area *a, PyObject *const *args, Py_ssize_t nargs);
static PyObject *Area_gather_root(Area *a, PyObject *const *args, Py_ssize_t nargs);

/* The root's call numbered (f, seq): True or (f, seq, how, bad) (see run); NULL on
 * an error. */
static PyObject *root_go(Step *s, Area *area, PyObject *out, PyObject *inp, long long f,
                         long long seq) {
    long how = -1, bad = -1;
    int unusual = step_unusual(s, f, !s->scatter);
    if (unusual < 0)
        return NULL;
    PyObject *fo = NULL, *so = NULL, *result = NULL;
    if (!unusual && PyObject_SetAttr(s->rooted, s_behind, Py_None) < 0)
        goto done;
    int taken = unusual ? 0 : step_take_area(s, area, f, seq, &fo, &so);
    if (taken < 0)
        goto done;
    if (taken && s->scatter) {
        PyObject *a[6] = {fo, s->key, so, inp, out, s->nb};
        PyObject *r = Area_scatter_root(area, a, 6);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
        PyObject *call = PyObject_CallOneArg(s->make_call, so);
        if (call == NULL)
            goto done;
        PyObject *pending = PyTuple_Pack(3, fo, s->key, call);
        Py_DECREF(call);
        int failed = pending == NULL || PyObject_SetAttr(s->rooted, s_pending, pending) < 0;
        Py_XDECREF(pending);
        if (failed)
            goto done;
        how = DONE;
    } else if (taken) {
        PyObject *pending = PyObject_GetAttr(s->rooted, s_pending);
        if (pending == NULL)
            goto done;
        PyObject *pf, *pkey;
        if (pending == Py_None) {
            pf = PyLong_FromLong(-1);
            pkey = Py_NewRef(s->key); /* (not read: no scatter pending) */
        } else if (PyTuple_Check(pending) && PyTuple_GET_SIZE(pending) == 3) {
            pf = Py_NewRef(PyTuple_GET_ITEM(pending, 0));
            pkey = Py_NewRef(PyTuple_GET_ITEM(pending, 1));
        } else {
            Py_DECREF(pending);
            PyErr_SetString(PyExc_TypeError, "minidist.shm._core.Step: a pending scatter");
            goto done;
        }
        Py_DECREF(pending);
        PyObject *a[9] = {fo, s->key, so, inp, out, s->nb, pf, pkey, s->nap};
        PyObject *r = pf == NULL ? NULL : Area_gather_root(area, a, 9);
        Py_XDECREF(pf);
        Py_DECREF(pkey);
        if (r == NULL)
            goto done;
        int parsed = PyArg_ParseTuple(r, "ll", &how, &bad);
        Py_DECREF(r);
        if (!parsed || (how == DONE && PyObject_SetAttr(s->rooted, s_pending, Py_None) < 0))
            goto done;
    }
    if (how == DONE) {
        if (step_pass_turn(s, f) == 0)
            result = Py_NewRef(Py_True);
    } else {
        result = Py_BuildValue("(LLll)", f, seq, how, bad);
    }
done:
    Py_XDECREF(fo);
    Py_XDECREF(so);
    return result;
}

/* Whether busy (None, or a list whose first item counts the threads numbering calls of
 * their own) says that another call is being numbered: 1, 0, or -1 on an error. */
static int numbering_busy(PyObject *busy) {
    if (busy == Py_None)
        return 0;
    if (!PyList_Check(busy) || PyList_GET_SIZE(busy) < 1) {
        PyErr_SetString(PyExc_TypeError, "minidist.shm._core.Step: busy is a list [count]");
        return -1;
    }
    return PyObject_IsTrue(PyList_GET_ITEM(busy, 0));
}

/* Check a call (out, inp, root, group) on either side against the step, and number it
 * unless `busy` says another call is being numbered: 1 (s->f and s->seq set), 0 (not
 * this call, or busy: nothing done), -1 on an error. */
static int step_numbers(Step *s, Area *area, PyObject *const *args, PyObject *busy) {
    int fits = step_call_fits(s, args[2], args[3]);
    if (s->is_root) {
        Py_ssize_t whole = s->nbytes * area->n;
        if (fits > 0)
            fits = step_array_fits(s, args[0], s->shape, s->scatter ? s->nbytes : whole, 1);
        if (fits > 0)
            fits = step_array_fits(s, args[1], s->in_shape, s->scatter ? whole : s->nbytes, 0);
    } else if (fits > 0) {
        fits = step_array_fits(s, s->scatter ? args[0] : args[1], s->shape, s->nbytes,
                               s->writable);
    }
    if (fits > 0) /* (nothing below runs Python code: the numbering is one step) */
        fits = numbering_busy(busy) == 0 ? 1 : (PyErr_Occurred() ? -1 : 0);
    if (fits <= 0)
        return fits;
    long long f = count_up(s->numbers, s->gid, 1);
    long long seq = f < 0 ? -1 : count_up(s->entered, s->gid, 0);
    if (seq < 0)
        return -1; /* (a broken table, not a call) */
    s->f = f;
    s->seq = seq;
    return 1;
}

/* Run the call numbered (f, seq) on either side. */
static PyObject *step_goes(Step *s, Area *area, PyObject *out, PyObject *inp, long long f,
                           long long seq) {
    if (s->is_root)
        return root_go(s, area, out, inp, f, seq);
    return step_go(s, area, s->scatter ? out : inp, f, seq);
}

/* A run raised after numbering its call (s->f, s->seq): tell s->failed(f, seq, exc), with
 * the exception still set afterwards (an error of failed itself is written as
 * unraisable: the call's own exception is what the caller sees). */
static void step_tell_failed(Step *s) {
    if (s->f < 0 || s->failed == Py_None)
        return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL && value != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *r = PyObject_CallFunction(s->failed, "LLO", s->f, s->seq,
                                        value != NULL ? value : Py_None);
    if (r == NULL)
        PyErr_WriteUnraisable(s->failed);
    Py_XDECREF(r);
    PyErr_Restore(type, value, tb);
}

/* run(out, inp, root, group[, busy]), a scatter's or gather's own arrays as the blocking
 * API takes them (a worker's other one is None) -> True (done), None (not this call:
 * nothing done) or the call numbered, for Python to go on: a worker's (f, seq, how): how
 * < 0, nothing run yet (the general run, or a wait for the area to be read first), else
 * the core's answer to finish (WAIT_MORE, DIFFER); a root's (f, seq, how, bad): how < 0
 * as a worker's, else the answer of the gather's root (WAIT_MORE, SETTLE_LATE,
 * SETTLE_DIFFERS, DIFFER; bad: the rank that differs). A scatter's root leaves its call
 * pending, as minidist.shm.rooted_area.Rooted.scatter_root does. With `busy` (a list
 * whose first item counts the threads numbering calls under a lock of their own, as
 * minidist.torch does), a call is numbered only while it is 0 (else None, nothing done):
 * the GIL, held from that look to the numbering, keeps other threads out. An exception
 * after the numbering leaves (f, seq) in `numbered` and is told to `failed` first. */
static PyObject *Step_run(Step *s, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "run(out, inp, root, group[, busy])");
        return NULL;
    }
    s->f = s->seq = -1;
    if (s->area == NULL)
        Py_RETURN_NONE;
    Area *area = (Area *)Py_NewRef(s->area); /* (drop() from another thread meanwhile) */
    int numbered = step_numbers(s, area, args, nargs == 5 ? args[4] : Py_None);
    PyObject *result = numbered <= 0 ? (numbered < 0 ? NULL : Py_NewRef(Py_None))
                                     : step_goes(s, area, args[0], args[1], s->f, s->seq);
    Py_DECREF(area);
    if (result == NULL)
        step_tell_failed(s);
    return result;
}

static PyObject *Step_get_numbered(Step *s, void *unused) {
    (void)unused;
    if (s->f < 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(LL)", s->f, s->seq);
}

/* drop(): never run again (the group's segment goes). */
static PyObject *Step_drop(Step *s, PyObject *unused) {
    (void)unused;
    Py_CLEAR(s->area);
    Py_RETURN_NONE;
}

static PyObject *Step_get_failed(Step *s, void *unused) {
    (void)unused;
    return Py_NewRef(s->failed);
}

static int Step_set_failed(Step *s, PyObject *value, void *unused) {
    (void)unused;
    if (value == NULL || (value != Py_None && !PyCallable_Check(value))) {
        PyErr_SetString(PyExc_TypeError, "Step.failed: a callable or None");
        return -1;
    }
    Py_SETREF(s->failed, Py_NewRef(value));
    return 0;
}

static PyGetSetDef Step_getset[] = {
    {"numbered", (getter)Step_get_numbered, NULL,
     "(f, seq) of the call the last run numbered, or None", NULL},
    {"failed", (getter)Step_get_failed, (setter)Step_set_failed,
     "failed(f, seq, exc): told when a run raises after numbering its call", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Step_methods[] = {
    {"run", (PyCFunction)(void (*)(void))Step_run, METH_FASTCALL, NULL},
    {"drop", (PyCFunction)Step_drop, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject StepType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "minidist.shm._core.Step",
    .tp_basicsize = sizeof(Step), .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A worker's repeated scatter or gather (minidist.shm.repeat), in one call.",
    .tp_new = PyType_GenericNew, .tp_init = (initproc)Step_init,
    .tp_dealloc = (destructor)Step_dealloc, .tp_methods = Step_methods,
    .tp_getset = Step_getset,
};

/* ------------------------------------------------------------------ kept tensor lists */

static PyObject *s_data_ptr, *s_numel, *s_is_contiguous, *s_is_conj, *s_is_neg,
    *s_requires_grad;

/* t.name() as a C long long (-1 with an error set on failure). */
static long long method_long(PyObject *t, PyObject *name) {
    PyObject *v = PyObject_CallMethodNoArgs(t, name);
    if (v == NULL)
        return -1;
    long long x = PyLong_AsLongLong(v);
    Py_DECREF(v);
    return x;
}

/* Whether t.name() is True (1), anything else (0), or -1 on an error. */
static int method_true(PyObject *t, PyObject *name) {
    PyObject *v = PyObject_CallMethodNoArgs(t, name);
    if (v == NULL)
        return -1;
    Py_DECREF(v);
    return v == Py_True;
}

/* tensors_same(ts, kept, ptrs, numels, dtype, plain) -> bool: whether the list or tuple
 * ts holds, in order, tensors of the kept ones' memory and layout: as many as `kept`,
 * each the kept tensor itself or one of type `plain` exactly with neither the conjugate
 * nor the negative bit, at address ptrs[i] (data_ptr()), of numels[i] elements,
 * contiguous (asked only of tensors of more than one element), of dtype `dtype`, not
 * requiring grad (minidist.torch._tensors.ListViews.same; a tensor whose methods raise
 * TypeError or RuntimeError is not the same). */
static PyObject *core_tensors_same(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    (void)m;
    if (nargs != 6 || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2]) ||
        !PyTuple_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "tensors_same(ts, kept: tuple, ptrs: tuple, numels: tuple, dtype, "
                        "plain)");
        return NULL;
    }
    PyObject *ts = args[0], *kept = args[1], *ptrs = args[2], *numels = args[3];
    PyObject *dtype = args[4], *plain = args[5];
    if (!PyList_Check(ts) && !PyTuple_Check(ts))
        Py_RETURN_FALSE;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(ts);
    if (n != PyTuple_GET_SIZE(kept) || n != PyTuple_GET_SIZE(ptrs) ||
        n != PyTuple_GET_SIZE(numels))
        Py_RETURN_FALSE;
    PyObject *seq = Py_NewRef(ts); /* (a list may change while its tensors are asked) */
    int same = 1;
    for (Py_ssize_t i = 0; same == 1 && i < n; i++) {
        if (i >= PySequence_Fast_GET_SIZE(seq)) {
            same = 0;
            break;
        }
        PyObject *t = Py_NewRef(PySequence_Fast_GET_ITEM(seq, i));
        if (t != PyTuple_GET_ITEM(kept, i)) {
            if ((PyObject *)Py_TYPE(t) != plain)
                same = 0;
            else if ((same = method_true(t, s_is_conj)) >= 0)
                same = same == 1 ? 0 : 1;
            if (same == 1 && (same = method_true(t, s_is_neg)) >= 0)
                same = same == 1 ? 0 : 1;
        }
        if (same == 1) {
            long long ptr = method_long(t, s_data_ptr);
            long long want = PyLong_AsLongLong(PyTuple_GET_ITEM(ptrs, i));
            if (PyErr_Occurred())
                same = -1;
            else
                same = ptr == want;
        }
        long long want_numel = 0;
        if (same == 1) {
            long long numel = method_long(t, s_numel);
            want_numel = PyLong_AsLongLong(PyTuple_GET_ITEM(numels, i));
            if (PyErr_Occurred())
                same = -1;
            else
                same = numel == want_numel;
        }
        if (same == 1 && want_numel > 1) /* (at most one element: contiguous anyway) */
            same = method_true(t, s_is_contiguous);
        if (same == 1) {
            PyObject *d = PyObject_GetAttr(t, s_dtype);
            same = d == NULL ? -1 : d == dtype;
            Py_XDECREF(d);
        }
        if (same == 1) {
            PyObject *g = PyObject_GetAttr(t, s_requires_grad);
            same = g == NULL ? -1 : g == Py_False;
            Py_XDECREF(g);
        }
        Py_DECREF(t);
    }
    Py_DECREF(seq);
    if (same < 0) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError) &&
            !PyErr_ExceptionMatches(PyExc_RuntimeError))
            return NULL;
        PyErr_Clear();
        same = 0;
    }
    return Py_NewRef(same ? Py_True : Py_False);
}

static PyMethodDef core_methods[] = {
    {"futex_wait", (PyCFunction)(void (*)(void))core_futex_wait, METH_FASTCALL,
     "futex_wait(addr, seen, timeout): sleep while the int32 at addr holds seen (GIL "
     "released)."},
    {"futex_wake", (PyCFunction)core_futex_wake, METH_O,
     "futex_wake(addr): wake every sleeper on the int32 at addr."},
    {"futex_add", (PyCFunction)(void (*)(void))core_futex_add, METH_FASTCALL,
     "futex_add(addr, equals): add 1 to the int32 at addr, wake one sleeper if it held "
     "equals."},
    {"fence", (PyCFunction)core_fence, METH_NOARGS, "fence(): a full memory fence."},
    {"tensors_same", (PyCFunction)(void (*)(void))core_tensors_same, METH_FASTCALL,
     "tensors_same(ts, kept, ptrs, numels, dtype, plain): whether a list of tensors is "
     "the kept one's memory and layout again (minidist.torch)."},
    {"wake_sleepers", (PyCFunction)core_wake_sleepers, METH_NOARGS,
     "wake_sleepers(): wake every thread of this process asleep in the core's waits."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT, "minidist.shm._core",
    "The compiled executor of minidist's shared-memory paths (see minidist.shm.core).", -1,
    core_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__core(void) {
    if (PyType_Ready(&AreaType) < 0 || PyType_Ready(&BoxType) < 0 ||
        PyType_Ready(&LaneType) < 0 || PyType_Ready(&StepType) < 0)
        return NULL;
    struct {
        PyObject **at;
        const char *name;
    } names[] = {{&s_default, "default"}, {&s_dtype, "dtype"}, {&s_shape, "shape"},
                 {&s_lost, "lost"}, {&s_left, "left"}, {&s_rendezvous_lost, "rendezvous_lost"},
                 {&s_acquire, "acquire"}, {&s_release, "release"}, {&s_inbox, "inbox"},
                 {&s_waiting, "waiting"}, {&s_early, "early"}, {&s_is_dead, "is_dead"},
                 {&s_p2p_waiting, "p2p_waiting"},
                 {&s_call_soon_threadsafe, "call_soon_threadsafe"}, {&s_p2p_seqs, "p2p_seqs"},
                 {&s_aborted, "_aborted"}, {&s_broken, "broken"}, {&s_died, "died"},
                 {&s_gave_up, "gave_up"}, {&s_pending, "pending"}, {&s_last, "last"},
                 {&s_behind, "behind"}, {&s_turn_done, "turn_done"}, {&s_slots, "slots"},
                 {&s_data_ptr, "data_ptr"}, {&s_numel, "numel"},
                 {&s_is_contiguous, "is_contiguous"}, {&s_is_conj, "is_conj"},
                 {&s_is_neg, "is_neg"}, {&s_requires_grad, "requires_grad"}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (*names[i].at == NULL && (*names[i].at = PyUnicode_InternFromString(names[i].name)) == NULL)
            return NULL;
    PyObject *m = PyModule_Create(&core_module);
    if (m == NULL)
        return NULL;
    struct {
        PyTypeObject *type;
        const char *name;
    } types[] = {{&AreaType, "Area"}, {&BoxType, "Box"}, {&LaneType, "Lane"},
                 {&StepType, "Step"}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (PyModule_AddObjectRef(m, types[i].name, (PyObject *)types[i].type) < 0) {
            Py_DECREF(m);
            return NULL;
        }
    if (PyModule_AddIntConstant(m, "DONE", DONE) < 0 ||
        PyModule_AddIntConstant(m, "DIFFER", DIFFER) < 0 ||
        PyModule_AddIntConstant(m, "WAIT_MORE", WAIT_MORE) < 0 ||
        PyModule_AddIntConstant(m, "SETTLE_LATE", SETTLE_LATE) < 0 ||
        PyModule_AddIntConstant(m, "SETTLE_DIFFERS", SETTLE_DIFFERS) < 0 ||
        PyModule_AddIntConstant(m, "ABI", 2) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
