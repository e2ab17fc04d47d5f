/* fsync and fdatasync fail with EIO, for the fault tests (tests/system/faults/fsyncfault.py).
 *
 * Loaded with LD_PRELOAD into a real process. While the file named by FAILFSYNC_FLAG exists,
 * every fsync or fdatasync of a file at or under FAILFSYNC_UNDER fails with EIO, as a disk
 * whose write-back fails reports it; otherwise the real call runs. The process's writes
 * themselves are untouched. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failing(int fd) {
    const char *flag = getenv("FAILFSYNC_FLAG");
    const char *under = getenv("FAILFSYNC_UNDER");
    int saved = errno, hit = 0;
    if (flag != NULL && under != NULL && access(flag, F_OK) == 0) {
        char link[64], path[4096];
        snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
        ssize_t n = readlink(link, path, sizeof path - 1);
        size_t len = strlen(under);
        if (n >= 0) {
            path[n] = '\0';
            hit = strncmp(path, under, len) == 0 && (path[len] == '\0' || path[len] == '/');
        }
    }
    errno = saved; /* access and readlink must not leak their errno into a call that runs */
    return hit;
}

int fsync(int fd) {
    static int (*real)(int);
    if (failing(fd)) {
        errno = EIO;
        return -1;
    }
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    return real(fd);
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (failing(fd)) {
        errno = EIO;
        return -1;
    }
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    return real(fd);
}
