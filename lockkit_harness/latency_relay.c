/*
 * A TCP relay that delays every byte by a fixed one-way latency in each direction: a network round trip on loopback
 * (the kernel here has no netem). Compiled at run time by lockkit_harness/latency.py.
 *
 *   latency_relay LISTEN_PORT TARGET TARGET_PORT ONE_WAY_DELAY_US
 *
 * TARGET is a host address (IPv4) or, when it starts with '/', a Unix socket path (TARGET_PORT is then ignored).
 * LISTEN_PORT 0 picks a free port. The relay listens on 127.0.0.1, prints "PORT <n>" on stdout once it accepts
 * connections, and runs until it is killed.
 *
 * Each connection gets two directions; each direction a reader thread, which stamps every chunk it reads with
 * "now + delay", and a writer thread, which sleeps until a chunk is due (absolute CLOCK_MONOTONIC, 1 ns timer slack)
 * and writes it. Bandwidth is not limited and chunks are never reordered: latency only.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define CHUNK 65536

struct chunk {
    struct chunk *next;
    struct timespec due;
    ssize_t len; /* 0: end of stream */
    char data[];
};

struct link;

struct direction {
    struct link *link;
    int src, dst;
    pthread_mutex_t lock;
    pthread_cond_t ready;
    struct chunk *head, *tail;
};

struct link {
    struct direction up, down; /* client -> server, server -> client */
    int client, server;
    int threads_left;
    pthread_mutex_t lock;
};

static long delay_ns;

static void add_ns(struct timespec *t, long ns) {
    t->tv_nsec += ns;
    while (t->tv_nsec >= 1000000000L) {
        t->tv_nsec -= 1000000000L;
        t->tv_sec += 1;
    }
}

static void thread_done(struct link *link) {
    pthread_mutex_lock(&link->lock);
    int left = --link->threads_left;
    pthread_mutex_unlock(&link->lock);
    if (left == 0) {
        close(link->client);
        close(link->server);
        free(link);
    }
}

static void push(struct direction *d, struct chunk *c) {
    c->next = NULL;
    pthread_mutex_lock(&d->lock);
    if (d->tail) d->tail->next = c;
    else d->head = c;
    d->tail = c;
    pthread_cond_signal(&d->ready);
    pthread_mutex_unlock(&d->lock);
}

static void *reader(void *arg) {
    struct direction *d = arg;
    for (;;) {
        struct chunk *c = malloc(sizeof(struct chunk) + CHUNK);
        if (!c) abort();
        ssize_t n = read(d->src, c->data, CHUNK);
        if (n < 0 && errno == EINTR) {
            free(c);
            continue;
        }
        clock_gettime(CLOCK_MONOTONIC, &c->due);
        add_ns(&c->due, delay_ns);
        c->len = n > 0 ? n : 0;
        push(d, c);
        if (n <= 0) break;
    }
    thread_done(d->link);
    return NULL;
}

static void *writer(void *arg) {
    struct direction *d = arg;
    int failed = 0;
    for (;;) {
        pthread_mutex_lock(&d->lock);
        while (!d->head) pthread_cond_wait(&d->ready, &d->lock);
        struct chunk *c = d->head;
        d->head = c->next;
        if (!d->head) d->tail = NULL;
        pthread_mutex_unlock(&d->lock);
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &c->due, NULL) == EINTR) {
        }
        ssize_t len = c->len;
        if (len == 0) {
            free(c);
            shutdown(d->dst, SHUT_WR);
            break;
        }
        for (ssize_t off = 0; !failed && off < len;) {
            ssize_t n = write(d->dst, c->data + off, (size_t)(len - off));
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                /* The receiving side is gone: stop both directions (their readers see the end of stream). */
                failed = 1;
                shutdown(d->link->client, SHUT_RDWR);
                shutdown(d->link->server, SHUT_RDWR);
                break;
            }
            off += n;
        }
        free(c);
    }
    thread_done(d->link);
    return NULL;
}

static int connect_target(const char *target, int port) {
    int fd;
    if (target[0] == '/') {
        struct sockaddr_un addr = {.sun_family = AF_UNIX};
        if (strlen(target) >= sizeof(addr.sun_path)) return -1;
        strcpy(addr.sun_path, target);
        fd = socket(AF_UNIX, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
            if (fd >= 0) close(fd);
            return -1;
        }
        return fd;
    }
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, target, &addr.sin_addr) != 1) return -1;
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static void start_direction(struct link *link, struct direction *d, int src, int dst) {
    d->link = link;
    d->src = src;
    d->dst = dst;
    d->head = d->tail = NULL;
    pthread_mutex_init(&d->lock, NULL);
    pthread_cond_init(&d->ready, NULL);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    pthread_t t;
    if (pthread_create(&t, &attr, writer, d) != 0 || pthread_create(&t, &attr, reader, d) != 0) abort();
    pthread_attr_destroy(&attr);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s LISTEN_PORT TARGET TARGET_PORT ONE_WAY_DELAY_US\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    delay_ns = atol(argv[4]) * 1000L;
    int target_port = atoi(argv[3]);
    int listener = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener, (struct sockaddr *)&addr, sizeof(addr)) < 0 || listen(listener, 128) < 0) {
        perror("latency_relay: listen");
        return 1;
    }
    socklen_t size = sizeof(addr);
    getsockname(listener, (struct sockaddr *)&addr, &size);
    printf("PORT %d\n", ntohs(addr.sin_port));
    fflush(stdout);
    for (;;) {
        int client = accept(listener, NULL, NULL);
        if (client < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            perror("latency_relay: accept");
            return 1;
        }
        setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        int server = connect_target(argv[2], target_port);
        if (server < 0) {
            close(client);
            continue;
        }
        struct link *link = calloc(1, sizeof(struct link));
        if (!link) abort();
        link->client = client;
        link->server = server;
        link->threads_left = 4;
        pthread_mutex_init(&link->lock, NULL);
        start_direction(link, &link->up, client, server);
        start_direction(link, &link->down, server, client);
    }
}
