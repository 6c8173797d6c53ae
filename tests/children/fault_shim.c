#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* Fails fsync/fdatasync with EIO (FAULT_SHIM_KIND=fsync) or writes with ENOSPC
   (FAULT_SHIM_KIND=write) on files whose path contains FAULT_SHIM_MATCH, while
   the file FAULT_SHIM_ARM exists.  Each injected failure appends a line to
   FAULT_SHIM_LOG. */
static int armed(const char *kind, int fd) {
    const char *want = getenv("FAULT_SHIM_KIND"), *arm = getenv("FAULT_SHIM_ARM");
    const char *match = getenv("FAULT_SHIM_MATCH"), *log = getenv("FAULT_SHIM_LOG");
    char link[64], target[4096];
    ssize_t n;
    if (!want || !arm || !match || strcmp(want, kind) != 0 || access(arm, F_OK) != 0) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, target, sizeof target - 1);
    if (n < 0) return 0;
    target[n] = '\0';
    if (strstr(target, match) == NULL) return 0;
    if (log) { FILE *f = fopen(log, "a"); if (f) { fprintf(f, "%s %s\n", kind, target); fclose(f); } }
    return 1;
}

typedef int (*sync_fn)(int);
typedef ssize_t (*pwrite_fn)(int, const void *, size_t, off_t);
typedef ssize_t (*pwrite64_fn)(int, const void *, size_t, off64_t);
typedef ssize_t (*write_fn)(int, const void *, size_t);

int fsync(int fd) {
    static sync_fn real = NULL;
    if (!real) real = (sync_fn)dlsym(RTLD_NEXT, "fsync");
    if (armed("fsync", fd)) { errno = EIO; return -1; }
    return real(fd);
}

int fdatasync(int fd) {
    static sync_fn real = NULL;
    if (!real) real = (sync_fn)dlsym(RTLD_NEXT, "fdatasync");
    if (armed("fsync", fd)) { errno = EIO; return -1; }
    return real(fd);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off64_t offset) {
    static pwrite64_fn real = NULL;
    if (!real) real = (pwrite64_fn)dlsym(RTLD_NEXT, "pwrite64");
    if (armed("write", fd)) { errno = ENOSPC; return -1; }
    return real(fd, buf, count, offset);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    static pwrite_fn real = NULL;
    if (!real) real = (pwrite_fn)dlsym(RTLD_NEXT, "pwrite");
    if (armed("write", fd)) { errno = ENOSPC; return -1; }
    return real(fd, buf, count, offset);
}

ssize_t write(int fd, const void *buf, size_t count) {
    static write_fn real = NULL;
    if (!real) real = (write_fn)dlsym(RTLD_NEXT, "write");
    if (armed("write", fd)) { errno = ENOSPC; return -1; }
    return real(fd, buf, count);
}
