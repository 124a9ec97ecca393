#define _GNU_SOURCE
#include "drivebus_support.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

// Written in C because only async-signal-safe calls may run between fork and exec in a
// multi-threaded process; Swift code there could allocate or take a lock.
pid_t drivebus_spawn(const char *path, char *const argv[]) {
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0) {
        return pid;
    }
    sigset_t empty;
    sigemptyset(&empty);
    sigprocmask(SIG_SETMASK, &empty, NULL);
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig != SIGKILL && sig != SIGSTOP) {
            signal(sig, SIG_DFL);
        }
    }
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    // The parent may have died before prctl took effect.
    if (getppid() != parent) {
        _exit(127);
    }
    execv(path, argv);
    _exit(127);
}

int drivebus_eventfd(void) {
    return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

int drivebus_eventfd_signal(int fd) {
    uint64_t one = 1;
    ssize_t n;
    do {
        n = write(fd, &one, sizeof one);
    } while (n < 0 && errno == EINTR);
    return n == sizeof one ? 0 : -1;
}

int drivebus_eventfd_drain(int fd) {
    uint64_t value;
    ssize_t n;
    do {
        n = read(fd, &value, sizeof value);
    } while (n < 0 && errno == EINTR);
    return (n == sizeof value || (n < 0 && errno == EAGAIN)) ? 0 : -1;
}

int drivebus_thread_in_background(void) {
    struct sched_param none = {0};
    int scheduled = sched_setscheduler(0, SCHED_IDLE, &none);
    // ioprio_set has no glibc wrapper: class IDLE (3) in the top bits, `who` 0 the calling thread.
    int disk = (int)syscall(SYS_ioprio_set, 1 /* IOPRIO_WHO_PROCESS */, 0, 3 << 13);
    return scheduled == 0 && disk == 0 ? 0 : -1;
}

int drivebus_thread_name(const char *name) {
    char cut[16];
    strncpy(cut, name, sizeof cut - 1);
    cut[sizeof cut - 1] = 0;
    return pthread_setname_np(pthread_self(), cut);
}
