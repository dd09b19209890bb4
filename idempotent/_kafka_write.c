/*
 * The compiled write path of a Kafka producer's group (adapters/_kafka_bulk.py, NativeWriter).
 *
 * One call writes one group of batches into the open transaction of a confluent-kafka
 * transactional Producer, with the interpreter lock released from the first produce call
 * to the commit: every run's records are produced, each round is flushed, each run's
 * acknowledgements are checked (whole, consecutive, no error), and the transaction is
 * committed. It returns once, with every batch's base offset or what failed.
 *
 * librdkafka is the copy confluent-kafka loaded: its functions are resolved with dlsym from
 * confluent-kafka's extension (bind()). Acknowledgements are seen by an on_acknowledgement
 * interceptor: this module is also a librdkafka plugin (conf_init), named in the producer's
 * plugin.library.paths, so librdkafka calls it for every acknowledged or failed message on
 * its own threads, without Python. confluent-kafka's delivery report callback returns at
 * once for a message without its state object (_private NULL), as all of these are.
 *
 * confluent-kafka's other callbacks (error_cb, logger, stats) may still run inside
 * rd_kafka_flush and rd_kafka_commit_transaction: they take the interpreter lock back
 * through the thread's CallState, which this module sets as confluent-kafka's own blocking
 * calls do (CallState_begin/_end). That needs confluent-kafka's Handle layout, which is
 * checked at runtime (the handle's opaque is the Producer object) and pinned to the
 * versions the Python side accepts.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- librdkafka's ABI, declared (rdkafka.h is not shipped with confluent-kafka's wheels) ---- */

typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_conf_s rd_kafka_conf_t;
typedef struct rd_kafka_headers_s rd_kafka_headers_t;
typedef struct rd_kafka_error_s rd_kafka_error_t;
typedef int rd_kafka_resp_err_t;

typedef struct {
        rd_kafka_resp_err_t err;
        rd_kafka_topic_t *rkt;
        int32_t partition;
        void *payload;
        size_t len;
        void *key;
        size_t key_len;
        int64_t offset;
        void *_private;
} rd_kafka_message_t;

enum { VT_END = 0, VT_TOPIC = 1, VT_RKT = 2, VT_PARTITION = 3, VT_VALUE = 4, VT_KEY = 5,
       VT_OPAQUE = 6, VT_MSGFLAGS = 7, VT_TIMESTAMP = 8, VT_HEADER = 9, VT_HEADERS = 10 };
#define MSG_F_COPY 0x2
#define ERR_TIMED_OUT (-185)

typedef rd_kafka_resp_err_t(on_new_f)(rd_kafka_t *, const rd_kafka_conf_t *, void *, char *, size_t);
typedef rd_kafka_resp_err_t(on_destroy_f)(rd_kafka_t *, void *);
typedef rd_kafka_resp_err_t(on_ack_f)(rd_kafka_t *, rd_kafka_message_t *, void *);

static struct {
        int bound;
        void *(*opaque)(const rd_kafka_t *);
        rd_kafka_topic_t *(*topic_new)(rd_kafka_t *, const char *, void *);
        void (*topic_destroy)(rd_kafka_topic_t *);
        const char *(*topic_name)(const rd_kafka_topic_t *);
        int (*produce_batch)(rd_kafka_topic_t *, int32_t, int, rd_kafka_message_t *, int);
        rd_kafka_resp_err_t (*producev)(rd_kafka_t *, ...);
        rd_kafka_headers_t *(*headers_new)(size_t);
        void (*headers_destroy)(rd_kafka_headers_t *);
        rd_kafka_resp_err_t (*header_add)(rd_kafka_headers_t *, const char *, ssize_t, const void *, ssize_t);
        rd_kafka_resp_err_t (*flush)(rd_kafka_t *, int);
        rd_kafka_error_t *(*commit)(rd_kafka_t *, int);
        rd_kafka_resp_err_t (*error_code)(const rd_kafka_error_t *);
        const char *(*error_name)(const rd_kafka_error_t *);
        const char *(*error_string)(const rd_kafka_error_t *);
        int (*error_is_fatal)(const rd_kafka_error_t *);
        int (*error_is_retriable)(const rd_kafka_error_t *);
        int (*error_txn_requires_abort)(const rd_kafka_error_t *);
        void (*error_destroy)(rd_kafka_error_t *);
        const char *(*err2name)(rd_kafka_resp_err_t);
        rd_kafka_resp_err_t (*add_on_new)(rd_kafka_conf_t *, const char *, on_new_f *, void *);
        rd_kafka_resp_err_t (*add_on_destroy)(rd_kafka_t *, const char *, on_destroy_f *, void *);
        rd_kafka_resp_err_t (*add_on_ack)(rd_kafka_t *, const char *, on_ack_f *, void *);
} rk;

/* ---- confluent-kafka's Handle and CallState (confluent_kafka.h, 2.16) ---- */

typedef struct {
        PyObject_HEAD rd_kafka_t *rk;
        PyObject *error_cb;
        PyObject *throttle_cb;
        PyObject *stats_cb;
        int initiated;
        Py_tss_t tlskey;
} Handle;

typedef struct {
        PyThreadState *thread_state;
        int crashed;
        PyObject *exception_value;
} CallState;

/* ---- acknowledgements, per librdkafka handle (the interceptor's state) ---- */

typedef struct {
        const char *topic; /* borrowed from the call's arguments while the round runs */
        int32_t partition;
        int64_t acked;
        int64_t low, high;
        rd_kafka_resp_err_t err;
} Slot;

typedef struct Acks {
        struct Acks *next;
        rd_kafka_t *rk;
        pthread_mutex_t lock;
        Slot *slots; /* the round's runs, one per partition; NULL between rounds */
        int count;
} Acks;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static Acks *registry;

static rd_kafka_resp_err_t on_ack(rd_kafka_t *handle, rd_kafka_message_t *m, void *opaque) {
        Acks *acks = opaque;
        (void)handle;
        pthread_mutex_lock(&acks->lock);
        if (acks->slots && m->rkt) {
                const char *topic = rk.topic_name(m->rkt);
                for (int i = 0; i < acks->count; i++) {
                        Slot *s = &acks->slots[i];
                        if (s->partition != m->partition || strcmp(s->topic, topic))
                                continue;
                        if (m->err) {
                                if (!s->err)
                                        s->err = m->err;
                        } else {
                                if (!s->acked || m->offset < s->low)
                                        s->low = m->offset;
                                if (!s->acked || m->offset > s->high)
                                        s->high = m->offset;
                                s->acked++;
                        }
                        break;
                }
        }
        pthread_mutex_unlock(&acks->lock);
        return 0;
}

static rd_kafka_resp_err_t on_destroy(rd_kafka_t *handle, void *opaque) {
        Acks *acks = opaque, **at;
        (void)handle;
        pthread_mutex_lock(&registry_lock);
        for (at = &registry; *at; at = &(*at)->next)
                if (*at == acks) {
                        *at = acks->next;
                        break;
                }
        pthread_mutex_unlock(&registry_lock);
        pthread_mutex_destroy(&acks->lock);
        free(acks);
        return 0;
}

static rd_kafka_resp_err_t on_new(rd_kafka_t *handle, const rd_kafka_conf_t *conf, void *opaque, char *errstr,
                                  size_t size) {
        Acks *acks = calloc(1, sizeof(*acks));
        (void)conf;
        (void)opaque;
        if (!acks) {
                snprintf(errstr, size, "idempotent: out of memory");
                return -1;
        }
        acks->rk = handle;
        pthread_mutex_init(&acks->lock, NULL);
        rk.add_on_ack(handle, "idempotent", on_ack, acks);
        rk.add_on_destroy(handle, "idempotent", on_destroy, acks);
        pthread_mutex_lock(&registry_lock);
        acks->next = registry;
        registry = acks;
        pthread_mutex_unlock(&registry_lock);
        return 0;
}

/* librdkafka's plugin entry point (plugin.library.paths names this file) */
__attribute__((visibility("default"))) rd_kafka_resp_err_t conf_init(rd_kafka_conf_t *conf, void **plug_opaquep,
                                                                     char *errstr, size_t size) {
        (void)plug_opaquep;
        if (!rk.bound) {
                snprintf(errstr, size, "idempotent._kafka_write: not bound to librdkafka");
                return -1;
        }
        return rk.add_on_new(conf, "idempotent", on_new, NULL);
}

static Acks *acks_of(rd_kafka_t *handle) {
        Acks *acks;
        pthread_mutex_lock(&registry_lock);
        for (acks = registry; acks && acks->rk != handle; acks = acks->next)
                ;
        pthread_mutex_unlock(&registry_lock);
        return acks;
}

/* ---- bind(path): resolve librdkafka's functions from confluent-kafka's extension ---- */

#define RESOLVE(field, name)                                                   \
        do {                                                                   \
                *(void **)&rk.field = dlsym(lib, name);                        \
                if (!rk.field) {                                               \
                        PyErr_Format(PyExc_ImportError, "librdkafka has no %s", name); \
                        return NULL;                                           \
                }                                                              \
        } while (0)

static PyObject *bind(PyObject *self, PyObject *args) {
        const char *path;
        void *lib;
        (void)self;
        if (!PyArg_ParseTuple(args, "s", &path))
                return NULL;
        if (rk.bound)
                Py_RETURN_NONE;
        lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
        if (!lib) {
                PyErr_Format(PyExc_ImportError, "%s is not loaded: %s", path, dlerror());
                return NULL;
        }
        RESOLVE(opaque, "rd_kafka_opaque");
        RESOLVE(topic_new, "rd_kafka_topic_new");
        RESOLVE(topic_destroy, "rd_kafka_topic_destroy");
        RESOLVE(topic_name, "rd_kafka_topic_name");
        RESOLVE(produce_batch, "rd_kafka_produce_batch");
        RESOLVE(producev, "rd_kafka_producev");
        RESOLVE(headers_new, "rd_kafka_headers_new");
        RESOLVE(headers_destroy, "rd_kafka_headers_destroy");
        RESOLVE(header_add, "rd_kafka_header_add");
        RESOLVE(flush, "rd_kafka_flush");
        RESOLVE(commit, "rd_kafka_commit_transaction");
        RESOLVE(error_code, "rd_kafka_error_code");
        RESOLVE(error_name, "rd_kafka_error_name");
        RESOLVE(error_string, "rd_kafka_error_string");
        RESOLVE(error_is_fatal, "rd_kafka_error_is_fatal");
        RESOLVE(error_is_retriable, "rd_kafka_error_is_retriable");
        RESOLVE(error_txn_requires_abort, "rd_kafka_error_txn_requires_abort");
        RESOLVE(error_destroy, "rd_kafka_error_destroy");
        RESOLVE(err2name, "rd_kafka_err2name");
        RESOLVE(add_on_new, "rd_kafka_conf_interceptor_add_on_new");
        RESOLVE(add_on_destroy, "rd_kafka_interceptor_add_on_destroy");
        RESOLVE(add_on_ack, "rd_kafka_interceptor_add_on_acknowledgement");
        rk.bound = 1;
        Py_RETURN_NONE;
}

/* the librdkafka handle of a confluent-kafka Producer whose handle carries this plugin, or NULL */
static rd_kafka_t *handle_of(PyObject *producer) {
        Handle *h = (Handle *)producer;
        if (!rk.bound || !h->rk || rk.opaque(h->rk) != (void *)producer || !PyThread_tss_is_created(&h->tlskey))
                return NULL;
        return acks_of(h->rk) ? h->rk : NULL;
}

static PyObject *attached(PyObject *self, PyObject *producer) {
        (void)self;
        return PyBool_FromLong(handle_of(producer) != NULL);
}

/* ---- the group, as C arrays (read under the lock, produced without it) ---- */

typedef struct {
        const char *name;
        Py_ssize_t name_len;
        const char *value;
        Py_ssize_t value_len;
} Header;

typedef struct {
        const char *value, *key;
        Py_ssize_t value_len, key_len;
        int64_t timestamp; /* 0: the time of the call */
        Py_ssize_t header, headers; /* first entry in Group.headers, how many; -1: none */
} Message;

typedef struct {
        const char *topic;
        int32_t partition;
        Py_ssize_t first, count; /* its messages in Group.messages */
        int plain;               /* records after the head have no headers or times: produce_batch */
} Batch;

typedef struct {
        Batch *batches;
        Py_ssize_t nbatches;
        Message *messages;
        Py_ssize_t nmessages;
        Header *headers;
        Py_ssize_t nheaders, cap_headers;
        Py_ssize_t *runs; /* per round: run count, then per run: batch count and the batch indexes */
        Py_ssize_t nruns;
} Group;

static void group_free(Group *g) {
        PyMem_Free(g->batches);
        PyMem_Free(g->messages);
        PyMem_Free(g->headers);
        PyMem_Free(g->runs);
}

static int bytes_of(PyObject *o, const char **data, Py_ssize_t *len) {
        if (o == Py_None) {
                *data = NULL;
                *len = 0;
                return 0;
        }
        if (PyBytes_CheckExact(o)) {
                *data = PyBytes_AS_STRING(o);
                *len = PyBytes_GET_SIZE(o);
                return 0;
        }
        if (PyUnicode_CheckExact(o)) {
                *data = PyUnicode_AsUTF8AndSize(o, len);
                return *data ? 0 : -1;
        }
        PyErr_SetString(PyExc_TypeError, "values, keys and header values must be bytes, str or None");
        return -1;
}

/* headers: a list of (str, bytes|str|None); appends to g->headers, sets m->header/headers */
static int read_headers(Group *g, Message *m, PyObject *list) {
        Py_ssize_t n;
        m->header = g->nheaders;
        m->headers = -1;
        if (list == Py_None)
                return 0;
        if (!PyList_Check(list)) {
                PyErr_SetString(PyExc_TypeError, "headers must be a list");
                return -1;
        }
        n = PyList_GET_SIZE(list);
        if (g->nheaders + n > g->cap_headers) {
                Py_ssize_t cap = (g->cap_headers + n) * 2;
                Header *grown = PyMem_Realloc(g->headers, cap * sizeof(Header));
                if (!grown) {
                        PyErr_NoMemory();
                        return -1;
                }
                g->headers = grown;
                g->cap_headers = cap;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
                PyObject *pair = PyList_GET_ITEM(list, i);
                Header *h = &g->headers[g->nheaders + i];
                if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
                    !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0))) {
                        PyErr_SetString(PyExc_TypeError, "a header must be a (str, bytes) tuple");
                        return -1;
                }
                h->name = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &h->name_len);
                if (!h->name || bytes_of(PyTuple_GET_ITEM(pair, 1), &h->value, &h->value_len))
                        return -1;
        }
        g->nheaders += n;
        m->headers = n;
        return 0;
}

static PyObject *item(PyObject *list, Py_ssize_t i) {
        return list == Py_None ? Py_None : PyList_GET_ITEM(list, i);
}

/*
 * batches: list of (topic: bytes, partition, head headers, timestamp ms, values, keys|None,
 * timestamps|None, headers|None); rounds: list of rounds, each a list of runs, each a list of
 * batch indexes.
 */
static int group_read(Group *g, PyObject *batches, PyObject *rounds) {
        Py_ssize_t total = 0, nruns = 0;
        memset(g, 0, sizeof(*g));
        g->nbatches = PyList_GET_SIZE(batches);
        for (Py_ssize_t b = 0; b < g->nbatches; b++) {
                PyObject *t = PyList_GET_ITEM(batches, b), *values;
                if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 8 || !PyList_Check(values = PyTuple_GET_ITEM(t, 4))) {
                        PyErr_SetString(PyExc_TypeError, "a batch must be an 8-tuple with a list of values");
                        return -1;
                }
                total += PyList_GET_SIZE(values);
        }
        g->batches = PyMem_Calloc(g->nbatches ? g->nbatches : 1, sizeof(Batch));
        g->messages = PyMem_Calloc(total ? total : 1, sizeof(Message));
        if (!g->batches || !g->messages) {
                PyErr_NoMemory();
                return -1;
        }
        for (Py_ssize_t b = 0; b < g->nbatches; b++) {
                PyObject *t = PyList_GET_ITEM(batches, b);
                PyObject *values = PyTuple_GET_ITEM(t, 4), *keys = PyTuple_GET_ITEM(t, 5);
                PyObject *times = PyTuple_GET_ITEM(t, 6), *headers = PyTuple_GET_ITEM(t, 7);
                Batch *batch = &g->batches[b];
                Py_ssize_t n = PyList_GET_SIZE(values);
                int64_t stamp = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 3));
                Py_ssize_t topic_len;
                if (!PyBytes_Check(PyTuple_GET_ITEM(t, 0)) || n == 0) {
                        PyErr_SetString(PyExc_TypeError, "a batch needs a topic (bytes) and records");
                        return -1;
                }
                batch->topic = PyBytes_AS_STRING(PyTuple_GET_ITEM(t, 0));
                topic_len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(t, 0));
                (void)topic_len;
                batch->partition = (int32_t)PyLong_AsLong(PyTuple_GET_ITEM(t, 1));
                if (PyErr_Occurred())
                        return -1;
                if ((keys != Py_None && (!PyList_Check(keys) || PyList_GET_SIZE(keys) != n)) ||
                    (times != Py_None && (!PyList_Check(times) || PyList_GET_SIZE(times) != n)) ||
                    (headers != Py_None && (!PyList_Check(headers) || PyList_GET_SIZE(headers) != n))) {
                        PyErr_SetString(PyExc_TypeError, "keys, timestamps and headers: a list as long as values, or None");
                        return -1;
                }
                batch->first = g->nmessages;
                batch->count = n;
                batch->plain = times == Py_None && headers == Py_None;
                for (Py_ssize_t i = 0; i < n; i++) {
                        Message *m = &g->messages[g->nmessages++];
                        PyObject *own = item(times, i);
                        if (bytes_of(PyList_GET_ITEM(values, i), &m->value, &m->value_len) ||
                            bytes_of(item(keys, i), &m->key, &m->key_len))
                                return -1;
                        m->timestamp = own == Py_None ? (i == 0 || !batch->plain ? stamp : 0) : PyLong_AsLongLong(own);
                        if (PyErr_Occurred())
                                return -1;
                        m->headers = -1;
                        if (i == 0) { /* the head: its own headers, then the identity headers */
                                Py_ssize_t start = g->nheaders;
                                if (read_headers(g, m, item(headers, 0)))
                                        return -1;
                                if (read_headers(g, m, PyTuple_GET_ITEM(t, 2)))
                                        return -1;
                                m->header = start;
                                m->headers = g->nheaders - start;
                        } else if (read_headers(g, m, item(headers, i))) {
                                return -1;
                        }
                }
        }
        /* rounds, flattened */
        for (Py_ssize_t r = 0; r < PyList_GET_SIZE(rounds); r++) {
                PyObject *round = PyList_GET_ITEM(rounds, r);
                nruns += 1 + PyList_GET_SIZE(round);
                for (Py_ssize_t i = 0; i < PyList_GET_SIZE(round); i++)
                        nruns += PyList_GET_SIZE(PyList_GET_ITEM(round, i));
        }
        g->runs = PyMem_Calloc(nruns ? nruns : 1, sizeof(Py_ssize_t));
        if (!g->runs) {
                PyErr_NoMemory();
                return -1;
        }
        for (Py_ssize_t r = 0; r < PyList_GET_SIZE(rounds); r++) {
                PyObject *round = PyList_GET_ITEM(rounds, r);
                g->runs[g->nruns++] = PyList_GET_SIZE(round);
                for (Py_ssize_t i = 0; i < PyList_GET_SIZE(round); i++) {
                        PyObject *run = PyList_GET_ITEM(round, i);
                        g->runs[g->nruns++] = PyList_GET_SIZE(run);
                        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(run); j++) {
                                Py_ssize_t index = PyLong_AsSsize_t(PyList_GET_ITEM(run, j));
                                if (index < 0 || index >= g->nbatches) {
                                        if (!PyErr_Occurred())
                                                PyErr_SetString(PyExc_IndexError, "a run names a batch out of range");
                                        return -1;
                                }
                                g->runs[g->nruns++] = index;
                        }
                }
        }
        return 0;
}

/* ---- the write, without the interpreter lock ---- */

enum { OK = 0, REFUSED, UNACKED, FAILED, MISSING, SPLIT };

typedef struct {
        int what;
        Py_ssize_t batch; /* REFUSED: the batch; MISSING, SPLIT: the run's first batch */
        rd_kafka_resp_err_t err;
        Py_ssize_t run_batches;
        int64_t run_records, low, high;
        int committed; /* -1: not tried, 0: failed (error set), 1: committed */
        rd_kafka_error_t *error;
} Outcome;

static rd_kafka_resp_err_t produce_one(rd_kafka_t *handle, Group *g, Batch *b, Message *m) {
        rd_kafka_headers_t *hdrs = NULL;
        rd_kafka_resp_err_t err;
        if (m->headers > 0) {
                hdrs = rk.headers_new((size_t)m->headers);
                for (Py_ssize_t i = 0; i < m->headers; i++) {
                        Header *h = &g->headers[m->header + i];
                        rk.header_add(hdrs, h->name, h->name_len, h->value, h->value ? h->value_len : -1);
                }
        }
        if (hdrs)
                err = rk.producev(handle, VT_TOPIC, b->topic, VT_PARTITION, b->partition, VT_VALUE, (void *)m->value,
                                  (size_t)m->value_len, VT_KEY, (void *)m->key, (size_t)m->key_len, VT_MSGFLAGS,
                                  MSG_F_COPY, VT_TIMESTAMP, m->timestamp, VT_HEADERS, hdrs, VT_END);
        else
                err = rk.producev(handle, VT_TOPIC, b->topic, VT_PARTITION, b->partition, VT_VALUE, (void *)m->value,
                                  (size_t)m->value_len, VT_KEY, (void *)m->key, (size_t)m->key_len, VT_MSGFLAGS,
                                  MSG_F_COPY, VT_TIMESTAMP, m->timestamp, VT_END);
        if (err && hdrs)
                rk.headers_destroy(hdrs); /* owned by the message only when produced */
        return err;
}

static int produce_batch(rd_kafka_t *handle, Group *g, Py_ssize_t index, Outcome *out) {
        Batch *b = &g->batches[index];
        Message *m = &g->messages[b->first];
        rd_kafka_resp_err_t err = produce_one(handle, g, b, m);
        if (err) {
                out->what = REFUSED;
                out->batch = index;
                out->err = err;
                return -1;
        }
        if (b->count == 1)
                return 0;
        if (!b->plain) {
                for (Py_ssize_t i = 1; i < b->count; i++)
                        if ((err = produce_one(handle, g, b, &m[i]))) {
                                out->what = REFUSED;
                                out->batch = index;
                                out->err = err;
                                return -1;
                        }
                return 0;
        }
        {
                int n = (int)(b->count - 1), queued;
                rd_kafka_message_t *msgs = calloc((size_t)n, sizeof(*msgs));
                rd_kafka_topic_t *rkt;
                if (!msgs) {
                        out->what = REFUSED;
                        out->batch = index;
                        out->err = -1;
                        return -1;
                }
                for (int i = 0; i < n; i++) {
                        msgs[i].payload = (void *)m[i + 1].value;
                        msgs[i].len = (size_t)m[i + 1].value_len;
                        msgs[i].key = (void *)m[i + 1].key;
                        msgs[i].key_len = (size_t)m[i + 1].key_len;
                }
                rkt = rk.topic_new(handle, b->topic, NULL);
                if (!rkt) {
                        free(msgs);
                        out->what = REFUSED;
                        out->batch = index;
                        out->err = -188; /* _UNKNOWN_TOPIC */
                        return -1;
                }
                queued = rk.produce_batch(rkt, b->partition, MSG_F_COPY, msgs, n);
                rk.topic_destroy(rkt);
                if (queued != n) {
                        out->what = REFUSED;
                        out->batch = index;
                        out->err = -1;
                        for (int i = 0; i < n; i++)
                                if (msgs[i].err) {
                                        out->err = msgs[i].err;
                                        break;
                                }
                        free(msgs);
                        return -1;
                }
                free(msgs);
        }
        return 0;
}

static void write_all(rd_kafka_t *handle, Acks *acks, Group *g, int timeout_ms, int commit, int64_t *offsets,
                      Outcome *out) {
        Py_ssize_t at = 0;
        out->committed = -1;
        while (at < g->nruns) {
                Py_ssize_t nruns = g->runs[at++], start = at;
                Slot *slots = calloc((size_t)(nruns ? nruns : 1), sizeof(Slot));
                if (!slots) {
                        out->what = UNACKED;
                        return;
                }
                for (Py_ssize_t r = 0; r < nruns; r++) {
                        Py_ssize_t n = g->runs[at], first = g->runs[at + 1];
                        slots[r].topic = g->batches[first].topic;
                        slots[r].partition = g->batches[first].partition;
                        at += 1 + n;
                }
                pthread_mutex_lock(&acks->lock);
                acks->slots = slots;
                acks->count = (int)nruns;
                pthread_mutex_unlock(&acks->lock);
                at = start;
                for (Py_ssize_t r = 0; r < nruns && !out->what; r++) {
                        Py_ssize_t n = g->runs[at++];
                        for (Py_ssize_t i = 0; i < n && !out->what; i++)
                                produce_batch(handle, g, g->runs[at + i], out);
                        at += n;
                }
                if (!out->what && rk.flush(handle, timeout_ms) == ERR_TIMED_OUT)
                        out->what = UNACKED;
                pthread_mutex_lock(&acks->lock);
                acks->slots = NULL;
                acks->count = 0;
                pthread_mutex_unlock(&acks->lock);
                at = start;
                for (Py_ssize_t r = 0; r < nruns && !out->what; r++) {
                        Py_ssize_t n = g->runs[at++], head = g->runs[at];
                        int64_t records = 0, offset = slots[r].low;
                        for (Py_ssize_t i = 0; i < n; i++)
                                records += g->batches[g->runs[at + i]].count;
                        if (slots[r].err) {
                                out->what = FAILED;
                                out->err = slots[r].err;
                        } else if (slots[r].acked != records) {
                                out->what = MISSING;
                                out->batch = head;
                        } else if (slots[r].high - slots[r].low != records - 1) {
                                out->what = SPLIT;
                                out->batch = head;
                                out->run_batches = n;
                                out->run_records = records;
                                out->low = slots[r].low;
                                out->high = slots[r].high;
                        } else {
                                for (Py_ssize_t i = 0; i < n; i++) {
                                        offsets[g->runs[at + i]] = offset;
                                        offset += g->batches[g->runs[at + i]].count;
                                }
                        }
                        at += n;
                }
                /* a delivery error of any run is the cause, before a split or a missing record */
                for (Py_ssize_t r = 0; r < nruns; r++)
                        if (slots[r].err && out->what != REFUSED && out->what != UNACKED) {
                                out->what = FAILED;
                                out->err = slots[r].err;
                                break;
                        }
                free(slots);
                if (out->what)
                        return;
        }
        if (commit) {
                out->error = rk.commit(handle, timeout_ms);
                out->committed = out->error ? 0 : 1;
        }
}

static PyObject *outcome_tuple(Outcome *out) {
        PyObject *commit;
        if (out->committed < 0) {
                commit = Py_False;
                Py_INCREF(commit);
        } else if (out->committed) {
                commit = Py_None;
                Py_INCREF(commit);
        } else {
                commit = Py_BuildValue("(issiii)", rk.error_code(out->error), rk.error_name(out->error),
                                       rk.error_string(out->error), rk.error_is_fatal(out->error),
                                       rk.error_is_retriable(out->error), rk.error_txn_requires_abort(out->error));
                rk.error_destroy(out->error);
                out->error = NULL;
                if (!commit)
                        return NULL;
        }
        switch (out->what) {
        case OK:
                return Py_BuildValue("(ON)", Py_None, commit);
        case REFUSED:
                return Py_BuildValue("((snis)N)", "refused", out->batch, out->err,
                                     out->err == -1 ? "_FAIL" : rk.err2name(out->err), commit);
        case UNACKED:
                return Py_BuildValue("((s)N)", "unacked", commit);
        case FAILED:
                return Py_BuildValue("((si)N)", "failed", out->err, commit);
        case MISSING:
                return Py_BuildValue("((sn)N)", "missing", out->batch, commit);
        default:
                return Py_BuildValue("((snnLLL)N)", "split", out->batch, out->run_batches, out->run_records, out->low,
                                     out->high, commit);
        }
}

static PyObject *write_group(PyObject *self, PyObject *args) {
        PyObject *producer, *batches, *rounds, *result = NULL, *offsets_list = NULL, *answer;
        int timeout_ms, commit;
        rd_kafka_t *handle;
        Acks *acks;
        Group g;
        Outcome out;
        int64_t *offsets;
        CallState cs;
        Handle *h;
        (void)self;
        if (!PyArg_ParseTuple(args, "OO!O!ip", &producer, &PyList_Type, &batches, &PyList_Type, &rounds, &timeout_ms,
                              &commit))
                return NULL;
        if (!(handle = handle_of(producer)) || !(acks = acks_of(handle))) {
                PyErr_SetString(PyExc_ValueError, "the producer's handle does not carry the idempotent plugin");
                return NULL;
        }
        h = (Handle *)producer;
        if (group_read(&g, batches, rounds)) {
                group_free(&g);
                return NULL;
        }
        offsets = PyMem_Malloc((size_t)(g.nbatches ? g.nbatches : 1) * sizeof(int64_t));
        if (!offsets) {
                group_free(&g);
                return PyErr_NoMemory();
        }
        for (Py_ssize_t i = 0; i < g.nbatches; i++)
                offsets[i] = -1;
        memset(&out, 0, sizeof(out));
        Py_INCREF(producer); /* the handle outlives the call */
        Py_INCREF(batches);  /* the payloads the messages point at, until librdkafka copied them */
        cs.crashed = 0;
        cs.exception_value = NULL;
        cs.thread_state = PyEval_SaveThread();
        PyThread_tss_set(&h->tlskey, &cs);
        write_all(handle, acks, &g, timeout_ms, commit, offsets, &out);
        PyThread_tss_set(&h->tlskey, NULL);
        PyEval_RestoreThread(cs.thread_state);
        Py_DECREF(batches);
        answer = outcome_tuple(&out);
        if (cs.crashed) { /* a confluent-kafka callback raised: its exception is the answer */
                Py_XDECREF(answer);
                if (cs.exception_value)
                        PyErr_SetObject(PyExceptionInstance_Class(cs.exception_value), cs.exception_value);
                else if (!PyErr_Occurred())
                        PyErr_SetString(PyExc_RuntimeError, "a confluent-kafka callback failed during the write");
                goto done;
        }
        if (!answer)
                goto done;
        offsets_list = PyList_New(g.nbatches);
        if (!offsets_list) {
                Py_DECREF(answer);
                goto done;
        }
        for (Py_ssize_t i = 0; i < g.nbatches; i++)
                PyList_SET_ITEM(offsets_list, i, PyLong_FromLongLong(offsets[i]));
        result = Py_BuildValue("(NOO)", offsets_list, PyTuple_GET_ITEM(answer, 0), PyTuple_GET_ITEM(answer, 1));
        Py_DECREF(answer);
done:
        Py_DECREF(producer);
        PyMem_Free(offsets);
        group_free(&g);
        return result;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "bind(path): resolve librdkafka's functions from the loaded library at path."},
    {"attached", attached, METH_O, "attached(producer): whether the producer's handle carries this plugin."},
    {"write_group", write_group, METH_VARARGS,
     "write_group(producer, batches, rounds, timeout_ms, commit) -> (offsets, failure, commit)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "idempotent._kafka_write",
                                    "The compiled write path of a Kafka group (see adapters/_kafka_bulk.py).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__kafka_write(void) {
        return PyModule_Create(&module);
}
