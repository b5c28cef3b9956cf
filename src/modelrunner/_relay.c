/* The relay's per-chunk loop, out of Python (issue 14, aim 1).

   server/front.py parses a streamed answer's head itself, then hands the two sockets (dups of them) to
   this module: one thread with its own epoll reads each chunk the engine writes and writes it to the
   client, following the chunked framing only far enough to know where the body ends, as Python's
   response_reader.py's reader does. It never runs Python per chunk. A hand-off does not wake the thread: add()
   registers the engine's socket in its epoll from Python's thread; it wakes when the engine writes. When a body ends (complete, the engine closed,
   the client left, invalid framing, or Python cancelled it) its result is queued and an eventfd, which
   the event loop watches, is written; Python then takes the results, ends the request as before and owns
   the sockets again. One result per stream, always.

   A stream may be handed over right after its head, before the engine's first bytes (llama-server sends
   the head as its prefill starts): until those bytes come, a ping (a whole chunk, the front's SSE comment)
   goes to the client every `ping_every` seconds of silence, as server/front.py writes them when it relays;
   a ping counts neither in `sent` nor for `first_data`, nor as the engine's activity.

   Back-pressure: one buffer per stream; while the client has not taken all of it, the engine socket is
   not watched, so a slow client slows its engine down (TCP's own flow control), as before.
   The recorder's copy: the body's data (its chunks' contents, unframed, as parsed: so Python need not
   unframe it), the first `head_limit` bytes and the last `tail_limit` bytes after them. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BUFFER_SIZE 65536
#define MAX_CHUNK_LINE 4096 /* chunking.MAX_CHUNK_LINE */
#define MAX_CHUNK_SIZE ((uint64_t)1 << 62) /* chunking.MAX_CHUNK_SIZE */
#define SWEEP_SECONDS 0.25 /* how often idle engines (and pings due) are looked for, while streams are live */
#define MAX_PING 64

enum end {
    RUNNING = 0,
    COMPLETE = 1,       /* the last chunk and the trailers came, all written */
    ENGINE_CLOSED = 2,  /* the engine's connection ended before the body did */
    ENGINE_ERROR = 3,   /* reading from the engine failed */
    INVALID = 4,        /* the engine's framing was invalid: of that read, only whole chunks were written */
    CLIENT_GONE = 5,    /* writing to the client failed */
    CANCELLED = 6,      /* Python asked (the client left, or a shutdown) */
    ENGINE_IDLE = 7,    /* the engine sent nothing for its idle limit while it was read */
};

enum parse { SIZE_LINE, DATA, TRAILERS, DONE };

typedef struct stream {
    uint64_t id;
    int engine_fd, client_fd; /* dups, owned here */
    int engine_watched, client_watched;
    enum end end;
    const char *invalid; /* why the framing was invalid */
    /* chunked framing, followed as response_reader.ResponseReader follows it */
    enum parse state;
    uint64_t skip; /* DATA: bytes of the chunk's data and its CRLF still to come */
    uint64_t data_left; /* DATA: of which data */
    char line[MAX_CHUNK_LINE + 1];
    size_t line_len;
    unsigned char tail[2]; /* the last two data bytes */
    size_t boundary; /* parse(): where the last chunk that ended in this read ends (0: none did) */
    unsigned char boundary_tail[2]; /* the tail there */
    enum end pending; /* the end once what is buffered is written (INVALID: the whole chunks before it) */
    int excess; /* bytes beyond the body's end came */
    size_t out_start, out_end; /* of buffer: read, not yet written */
    uint64_t sent;
    double first_data;
    double idle_limit, idle_since; /* seconds (0: none); since when the engine, watched, sent nothing */
    char ping[MAX_PING]; /* written every ping_every seconds until the engine's first bytes (0: never) */
    size_t ping_len;
    double ping_every, ping_at;
    int out_is_ping; /* the buffer holds a ping, not the engine's bytes */
    int added; /* under lock: add() registered it (until then the sweep leaves it alone) */
    /* the recorder's copy */
    int record;
    char *head;
    size_t head_len, head_cap, head_limit;
    char *ring;
    size_t ring_limit, ring_total;
    struct stream *next; /* among the live streams, or the queued results */
    char buffer[BUFFER_SIZE]; /* last: not zeroed when a stream is made */
} stream;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int epoll_fd = -1, cancel_fd = -1, result_fd = -1;
static stream *live = NULL;     /* under lock: linked by add (Python), unlinked by the thread when they end */
static uint64_t *cancels = NULL; /* under lock: ids Python cancelled */
static size_t cancels_len = 0, cancels_cap = 0;
static stream *results = NULL;  /* under lock: ended streams, for Python */
static stream *ended_now = NULL; /* the relay thread's: ended in this batch of events, published after it
                                    (a later event of the batch may name them; Python frees them) */
static uint64_t next_id = 1;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* time.monotonic() */
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void poke(int fd) {
    uint64_t one = 1;
    while (write(fd, &one, sizeof one) < 0 && errno == EINTR) {
    }
}

/* Watch one side of a stream, or stop; returns 0 if epoll refused (ENOMEM, max_user_watches). Only one
   side is watched at a time, never with no events: an fd left registered with none would still report
   EPOLLHUP/EPOLLERR, level-triggered, in a busy loop. */
static int watch(stream *s, int fd, int *watched, uint32_t events, uintptr_t side, int on) {
    if (on == *watched)
        return 1;
    struct epoll_event ev = {.events = events, .data.ptr = (void *)((uintptr_t)s | side)};
    if (epoll_ctl(epoll_fd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, fd, &ev) < 0 && on)
        return 0;
    *watched = on;
    return 1;
}

static void finish(stream *s, enum end end) {
    if (s->end != RUNNING)
        return;
    s->end = end;
    watch(s, s->engine_fd, &s->engine_watched, 0, 0, 0);
    watch(s, s->client_fd, &s->client_watched, 0, 1, 0);
    close(s->engine_fd);
    close(s->client_fd);
    pthread_mutex_lock(&lock);
    stream **p = &live;
    while (*p != s)
        p = &(*p)->next;
    *p = s->next;
    pthread_mutex_unlock(&lock);
    s->next = ended_now;
    ended_now = s;
}

static void publish(void) {
    if (!ended_now)
        return;
    pthread_mutex_lock(&lock);
    while (ended_now) {
        stream *s = ended_now;
        ended_now = s->next;
        s->next = results;
        results = s;
    }
    pthread_mutex_unlock(&lock);
    poke(result_fd);
}

/* Data bytes of the body (its chunks' contents, without the framing), copied for the recorder as they are
   parsed (so a read found invalid further on, or left unwritten by a cancel, is recorded as far as it was
   parsed: what the engine sent); its buffers grow as needed: most answers are far shorter than head_limit,
   and most never reach the ring. Out of memory, the recording stops (the answer goes on). */
static int keep_or_fail(stream *s, const char *data, size_t len);

static void keep(stream *s, const unsigned char *bytes, size_t len) {
    const char *data = (const char *)bytes;
    if (!s->record || !len)
        return;
    if (!keep_or_fail(s, data, len)) {
        s->record = 0;
        s->head_len = 0;
        s->ring_total = 0;
    }
}

static int keep_or_fail(stream *s, const char *data, size_t len) {
    size_t room = s->head_limit - s->head_len;
    size_t n = len < room ? len : room;
    if (n) {
        if (s->head_len + n > s->head_cap) {
            size_t cap = s->head_cap ? s->head_cap : 16384;
            while (cap < s->head_len + n)
                cap *= 2;
            if (cap > s->head_limit)
                cap = s->head_limit;
            char *grown = realloc(s->head, cap);
            if (!grown)
                return 0;
            s->head = grown;
            s->head_cap = cap;
        }
        memcpy(s->head + s->head_len, data, n);
        s->head_len += n;
        data += n;
        len -= n;
    }
    if (!len || !s->ring_limit)
        return 1;
    if (!s->ring && !(s->ring = malloc(s->ring_limit)))
        return 0;
    if (len > s->ring_limit) {
        s->ring_total += len - s->ring_limit;
        data += len - s->ring_limit;
        len = s->ring_limit;
    }
    while (len) {
        size_t at = s->ring_total % s->ring_limit;
        size_t part = s->ring_limit - at < len ? s->ring_limit - at : len;
        memcpy(s->ring + at, data, part);
        s->ring_total += part;
        data += part;
        len -= part;
    }
    return 1;
}

/* The size on a chunk's size line (without its CRLF), by the rule of Python's chunking.chunk_size (RFC 9112):
   1*HEXDIG (leading zeros allowed; no sign, no 0x, no spaces) of at most MAX_CHUNK_SIZE, then optionally
   spaces or tabs, `;` and extensions (ignored; no control bytes but tab). Returns 0 if it is invalid. */
static int chunk_size(const char *line, size_t len, uint64_t *size) {
    size_t i = 0;
    uint64_t value = 0;
    for (; i < len; i++) {
        char c = line[i];
        int digit = c >= '0' && c <= '9' ? c - '0'
                    : c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                           : -1;
        if (digit < 0)
            break;
        if (value > MAX_CHUNK_SIZE >> 4) /* no overflow: value * 16 + 15 stays within 64 bits */
            return 0;
        value = value * 16 + (uint64_t)digit;
    }
    if (i == 0 || value > MAX_CHUNK_SIZE)
        return 0;
    if (i < len) {
        while (i < len && (line[i] == ' ' || line[i] == '\t'))
            i++;
        if (i == len || line[i] != ';')
            return 0;
        for (; i < len; i++) {
            unsigned char c = (unsigned char)line[i];
            if ((c < 32 && c != '\t') || c == 127)
                return 0;
        }
    }
    *size = value;
    return 1;
}

/* Follow the framing over `len` new bytes; returns how many of them belong to the body (the rest is
   excess), or -1 if the framing is invalid. */
static ssize_t parse(stream *s, const unsigned char *data, size_t len) {
    size_t pos = 0;
    s->boundary = 0;
    while (pos < len) {
        if (s->state == DATA) {
            size_t n = len - pos < s->skip ? len - pos : (size_t)s->skip;
            size_t data_n = n < s->data_left ? n : (size_t)s->data_left;
            keep(s, data + pos, data_n);
            if (data_n >= 2) {
                s->tail[0] = data[pos + data_n - 2];
                s->tail[1] = data[pos + data_n - 1];
            } else if (data_n == 1) {
                s->tail[0] = s->tail[1];
                s->tail[1] = data[pos];
            }
            s->data_left -= data_n;
            /* the rest of these n bytes are the CRLF after the data: `crlf` of it still to come */
            for (uint64_t k = data_n, crlf = s->skip - data_n; k < n; k++, crlf--)
                if (data[pos + k] != (crlf == 2 ? '\r' : '\n')) {
                    s->invalid = "no CRLF after a chunk's data";
                    return -1;
                }
            s->skip -= n;
            pos += n;
            if (!s->skip) {
                s->state = SIZE_LINE;
                s->boundary = pos;
                memcpy(s->boundary_tail, s->tail, 2);
            }
            continue;
        }
        if (s->state == DONE)
            break;
        const unsigned char *newline = memchr(data + pos, '\n', len - pos);
        size_t stop = newline ? (size_t)(newline - data) : len;
        if (s->line_len + (stop - pos) > MAX_CHUNK_LINE) {
            s->invalid = "a chunk line is too long";
            return -1;
        }
        memcpy(s->line + s->line_len, data + pos, stop - pos);
        s->line_len += stop - pos;
        pos = newline ? stop + 1 : len;
        if (!newline)
            break;
        size_t line_len = s->line_len;
        s->line_len = 0;
        if (!line_len || s->line[line_len - 1] != '\r') {
            s->invalid = "a chunk line does not end with CRLF";
            return -1;
        }
        line_len--;
        if (s->state == TRAILERS) {
            if (!line_len) /* the empty line after the trailers ends the body */
                s->state = DONE;
            continue;
        }
        uint64_t size;
        if (!chunk_size(s->line, line_len, &size)) {
            s->invalid = "invalid chunk size";
            return -1;
        }
        if (size == 0) {
            s->state = TRAILERS;
        } else {
            s->state = DATA;
            s->data_left = size;
            s->skip = size + 2;
        }
    }
    if (s->state == DONE && pos < len)
        s->excess = 1;
    return (ssize_t)pos;
}

/* Write what is buffered; then watch the engine again, or the client until it takes the rest. */
static void flush(stream *s) {
    while (s->out_start < s->out_end) {
        ssize_t n = send(s->client_fd, s->buffer + s->out_start, s->out_end - s->out_start,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            if (s->first_data == 0 && !s->out_is_ping)
                s->first_data = now();
            if (!s->out_is_ping)
                s->sent += (size_t)n;
            s->out_start += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            watch(s, s->engine_fd, &s->engine_watched, 0, 0, 0);
            if (!watch(s, s->client_fd, &s->client_watched, EPOLLOUT, 1, 1))
                finish(s, CLIENT_GONE);
            return;
        } else {
            finish(s, CLIENT_GONE);
            return;
        }
    }
    if (s->pending != RUNNING || s->state == DONE) {
        finish(s, s->pending != RUNNING ? s->pending : COMPLETE);
        return;
    }
    watch(s, s->client_fd, &s->client_watched, 0, 1, 0);
    if (!watch(s, s->engine_fd, &s->engine_watched, EPOLLIN | EPOLLRDHUP, 0, 1))
        finish(s, ENGINE_ERROR);
    if (s->out_is_ping) /* the engine is still silent: its idle time goes on */
        s->out_is_ping = 0;
    else
        s->idle_since = now(); /* the engine is read again: its idle time starts */
}

/* A ping to a stream whose engine has sent nothing yet (the engine is watched: all written before). */
static void ping(stream *s, double at) {
    memcpy(s->buffer, s->ping, s->ping_len);
    s->out_start = 0;
    s->out_end = s->ping_len;
    s->out_is_ping = 1;
    s->ping_at = at + s->ping_every;
    flush(s);
}

/* End the streams whose engine, read, sent nothing for their idle limit (a client that does not read is
   not the engine's idleness: the engine is not read meanwhile); ping those whose ping is due. Only streams
   whose add() is complete: add() links a stream before it registers it, and takes it back if that fails. */
static void sweep(void) {
    double at = now();
    stream *due[64];
    size_t pings = 0;
    pthread_mutex_lock(&lock);
    for (stream *s = live; s && pings < 64; s = s->next)
        if (s->added && s->engine_watched && s->ping_len && at >= s->ping_at)
            due[pings++] = s;
    pthread_mutex_unlock(&lock);
    for (size_t i = 0; i < pings; i++) /* (more than 64 due: the rest at the next sweep) */
        ping(due[i], at);
    for (;;) {
        stream *idle[64];
        size_t count = 0;
        pthread_mutex_lock(&lock);
        for (stream *s = live; s && count < 64; s = s->next)
            if (s->added && s->engine_watched && s->idle_limit > 0 && at - s->idle_since >= s->idle_limit)
                idle[count++] = s;
        pthread_mutex_unlock(&lock);
        for (size_t i = 0; i < count; i++)
            finish(idle[i], ENGINE_IDLE); /* unlinks it: the next pass finds the others */
        if (count < 64)
            return;
    }
}

static void engine_ready(stream *s) {
    ssize_t n = recv(s->engine_fd, s->buffer, BUFFER_SIZE, MSG_DONTWAIT);
    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            finish(s, ENGINE_ERROR);
        return;
    }
    if (n == 0) {
        finish(s, ENGINE_CLOSED);
        return;
    }
    s->ping_len = 0; /* the engine's first bytes: no more pings */
    /* of a read found invalid, only the whole chunks before the invalid bytes are written; the framing is
       left as it was there, to say where what was written ends (between chunks or not, its last data
       bytes) */
    enum parse state = s->state;
    size_t line_len = s->line_len;
    unsigned char tail[2] = {s->tail[0], s->tail[1]};
    ssize_t body = parse(s, (unsigned char *)s->buffer, (size_t)n);
    if (body < 0) {
        s->state = s->boundary ? SIZE_LINE : state;
        s->line_len = s->boundary ? 0 : line_len;
        memcpy(s->tail, s->boundary ? s->boundary_tail : tail, 2);
        s->pending = INVALID;
        body = (ssize_t)s->boundary;
    }
    s->out_start = 0;
    s->out_end = (size_t)body;
    flush(s);
}

static void take_cancels(void) {
    uint64_t count;
    while (read(cancel_fd, &count, sizeof count) < 0 && errno == EINTR) {
    }
    pthread_mutex_lock(&lock);
    uint64_t *ids = cancels;
    size_t ids_len = cancels_len;
    cancels = NULL;
    cancels_len = cancels_cap = 0;
    pthread_mutex_unlock(&lock);
    for (size_t i = 0; i < ids_len; i++) {
        stream *found = NULL;
        pthread_mutex_lock(&lock);
        for (stream *s = live; s && !found; s = s->next)
            if (s->id == ids[i])
                found = s;
        pthread_mutex_unlock(&lock);
        if (found) /* else it had ended: its result is on its way */
            finish(found, CANCELLED);
    }
    free(ids);
}

static void *run(void *unused) {
    (void)unused;
    struct epoll_event events[256];
    double next_sweep = 0;
    for (;;) {
        pthread_mutex_lock(&lock);
        int any = live != NULL;
        pthread_mutex_unlock(&lock);
        int n = epoll_wait(epoll_fd, events, 256, any ? (int)(SWEEP_SECONDS * 1000) : -1);
        for (int i = 0; i < n; i++) {
            uintptr_t tag = (uintptr_t)events[i].data.ptr;
            if (!tag) {
                take_cancels();
                continue;
            }
            stream *s = (stream *)(tag & ~(uintptr_t)1);
            if (s->end != RUNNING) /* it ended earlier in this batch */
                continue;
            if (tag & 1)
                flush(s);
            else
                engine_ready(s);
        }
        if (any && now() >= next_sweep) {
            sweep();
            next_sweep = now() + SWEEP_SECONDS;
        }
        publish();
    }
    return NULL;
}

static void free_stream(stream *s) {
    free(s->head);
    free(s->ring);
    free(s);
}

/* Python's side */

static PyObject *relay_start(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    if (result_fd >= 0)
        return PyLong_FromLong(result_fd);
    int epoll = epoll_create1(EPOLL_CLOEXEC);
    int cancel_events = eventfd(0, EFD_CLOEXEC);
    int results_ready = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    int failed = epoll < 0 || cancel_events < 0 || results_ready < 0 ? errno
                 : epoll_ctl(epoll, EPOLL_CTL_ADD, cancel_events, &ev) < 0 ? errno
                                                                      : 0;
    if (!failed) {
        epoll_fd = epoll;
        cancel_fd = cancel_events;
        /* the thread takes no signals: they stay with Python's main thread */
        sigset_t all, before;
        sigfillset(&all);
        pthread_sigmask(SIG_BLOCK, &all, &before);
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        failed = pthread_create(&thread, &attr, run, NULL);
        pthread_attr_destroy(&attr);
        pthread_sigmask(SIG_SETMASK, &before, NULL);
    }
    if (failed) {
        int fds[3] = {epoll, cancel_events, results_ready};
        for (int i = 0; i < 3; i++)
            if (fds[i] >= 0)
                close(fds[i]);
        epoll_fd = cancel_fd = -1;
        errno = failed;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    result_fd = results_ready; /* started: later calls return it */
    return PyLong_FromLong(result_fd);
}

static PyObject *relay_add(PyObject *self, PyObject *args) {
    (void)self;
    int client_fd, engine_fd, record;
    Py_buffer tail;
    Py_ssize_t head_limit, tail_limit;
    double idle, ping_every;
    Py_buffer ping_chunk;
    if (!PyArg_ParseTuple(args, "iiy*pnndy*d", &client_fd, &engine_fd, &tail, &record, &head_limit,
                          &tail_limit, &idle, &ping_chunk, &ping_every))
        return NULL;
    if (result_fd < 0 || tail.len != 2 || head_limit < 0 || tail_limit < 0 || !(idle >= 0) ||
        ping_chunk.len > MAX_PING || !(ping_every >= 0) || (ping_chunk.len && !(ping_every > 0))) {
        PyBuffer_Release(&tail);
        PyBuffer_Release(&ping_chunk);
        PyErr_SetString(PyExc_ValueError, "relay not started, or invalid arguments");
        return NULL;
    }
    stream *s = malloc(sizeof *s);
    PyObject *id = NULL;
    if (s) {
        memset(s, 0, offsetof(stream, buffer));
        pthread_mutex_lock(&lock);
        s->id = next_id++;
        pthread_mutex_unlock(&lock);
        id = PyLong_FromUnsignedLongLong(s->id);
    }
    if (!s || !id) {
        PyBuffer_Release(&tail);
        PyBuffer_Release(&ping_chunk);
        free(s);
        return PyErr_NoMemory();
    }
    memcpy(s->tail, tail.buf, 2);
    PyBuffer_Release(&tail);
    memcpy(s->ping, ping_chunk.buf, (size_t)ping_chunk.len);
    s->ping_len = (size_t)ping_chunk.len;
    s->ping_every = ping_every;
    PyBuffer_Release(&ping_chunk);
    s->engine_fd = engine_fd;
    s->client_fd = client_fd;
    s->state = SIZE_LINE;
    s->record = record;
    s->head_limit = (size_t)head_limit;
    s->ring_limit = (size_t)tail_limit;
    s->idle_limit = idle;
    s->idle_since = now();
    s->ping_at = s->idle_since + ping_every;
    /* The engine's socket is watched from here, by this thread: the relay thread wakes when the engine
       writes, not once more now. Only it touches the stream from then on (Python: cancel by id). */
    s->engine_watched = 1;
    pthread_mutex_lock(&lock);
    int first = live == NULL;
    s->next = live;
    live = s;
    pthread_mutex_unlock(&lock);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = s};
    if (epoll_ctl(epoll_fd, EPOLL_CTL_ADD, engine_fd, &ev) < 0) {
        int failed = errno;
        pthread_mutex_lock(&lock);
        live = s->next; /* still first: only this thread links, and the relay cannot have seen it */
        pthread_mutex_unlock(&lock);
        free(s);
        Py_DECREF(id);
        errno = failed;
        return PyErr_SetFromErrno(PyExc_OSError); /* the fds stay the caller's */
    }
    pthread_mutex_lock(&lock);
    s->added = 1;
    pthread_mutex_unlock(&lock);
    if (first)
        poke(cancel_fd); /* the thread waits without a timeout while no stream is live: now it sweeps */
    return id; /* from here on both fds are the relay's */
}

static PyObject *relay_cancel(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long id;
    if (!PyArg_ParseTuple(args, "K", &id))
        return NULL;
    pthread_mutex_lock(&lock);
    if (cancels_len == cancels_cap) {
        size_t cap = cancels_cap ? cancels_cap * 2 : 16;
        uint64_t *grown = realloc(cancels, cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&lock);
            return PyErr_NoMemory();
        }
        cancels = grown;
        cancels_cap = cap;
    }
    cancels[cancels_len++] = id;
    pthread_mutex_unlock(&lock);
    poke(cancel_fd);
    Py_RETURN_NONE;
}

static PyObject *recorded_tail(stream *s) {
    if (!s->record || !s->ring_total)
        return PyBytes_FromStringAndSize("", 0);
    size_t len = s->ring_total < s->ring_limit ? s->ring_total : s->ring_limit;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
    if (!out)
        return NULL;
    char *to = PyBytes_AS_STRING(out);
    size_t start = (s->ring_total - len) % s->ring_limit;
    size_t first = s->ring_limit - start < len ? s->ring_limit - start : len;
    memcpy(to, s->ring + start, first);
    memcpy(to + first, s->ring, len - first);
    return out;
}

static PyObject *relay_results(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    uint64_t count;
    while (read(result_fd, &count, sizeof count) < 0 && errno == EINTR) {
    }
    pthread_mutex_lock(&lock);
    stream *ended = results;
    results = NULL;
    pthread_mutex_unlock(&lock);
    PyObject *list = PyList_New(0);
    while (ended) {
        stream *s = ended;
        ended = ended->next;
        /* between chunks, and all that was read went out (a stream cancelled while its client was slow
           drops what it had not written yet) */
        int at_boundary = s->state == SIZE_LINE && s->line_len == 0 && s->out_start == s->out_end;
        PyObject *item = list == NULL ? NULL : Py_BuildValue(
            "(KiiiKdy#NNz)", (unsigned long long)s->id, (int)s->end, at_boundary, s->excess,
            (unsigned long long)s->sent, s->first_data, (const char *)s->tail, (Py_ssize_t)2,
            PyBytes_FromStringAndSize(s->record ? s->head : "", s->record ? (Py_ssize_t)s->head_len : 0),
            recorded_tail(s), s->invalid);
        free_stream(s);
        if (item == NULL || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            Py_CLEAR(list);
            continue; /* the rest are freed all the same */
        }
        Py_DECREF(item);
    }
    return list;
}

static PyMethodDef methods[] = {
    {"start", relay_start, METH_NOARGS, "Start the relay thread (once); returns the eventfd of results."},
    {"add", relay_add, METH_VARARGS,
     "add(client_fd, engine_fd, tail, record, head_limit, tail_limit, idle, ping, ping_every) -> id: relay "
     "a chunked body from the engine's socket to the client's, starting at a chunk boundary; both fds become "
     "the relay's. Recorded: the body's data, unframed. Ended (ENGINE_IDLE) when the engine sends nothing "
     "for `idle` seconds (0: no limit). Until the engine's first bytes, `ping` (a whole chunk, at most 64 "
     "bytes; empty: none) is written every `ping_every` seconds."},
    {"cancel", relay_cancel, METH_VARARGS, "cancel(id): end a stream; its result still comes."},
    {"results", relay_results, METH_NOARGS,
     "The ended streams: (id, end, at_boundary, excess, sent, first_data, tail, recorded head, "
     "recorded tail, why the framing was invalid or None)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_relay",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__relay(void) { return PyModule_Create(&module); }
