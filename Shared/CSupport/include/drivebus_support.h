#ifndef DRIVEBUS_SUPPORT_H
#define DRIVEBUS_SUPPORT_H

#include <sys/types.h>

/// Starts `path` with `argv` (NULL-terminated) in a child process that receives SIGTERM when the
/// calling thread's process dies (PR_SET_PDEATHSIG), so a killed supervisor leaves no orphans.
/// The child's signal mask and dispositions are reset to defaults before exec.
/// Returns the child's pid, or -1 with errno set.
pid_t drivebus_spawn(const char *path, char *const argv[]);

/// A Linux eventfd used to wake a zmq_poll loop from other threads. Returns -1 on error.
int drivebus_eventfd(void);
/// Adds one to the eventfd counter; safe from any thread.
int drivebus_eventfd_signal(int fd);
/// Resets the eventfd counter to zero. Returns 0 on success or when it was already zero.
int drivebus_eventfd_drain(int fd);

/// Puts the calling thread behind all other work, for jobs that may take as long as they like:
/// the CPU only when nothing else wants it (SCHED_IDLE) and the disk likewise (the idle I/O
/// class). Neither can be undone without privileges, so only for a thread that ends with its
/// job. Returns 0, or -1 with errno set when either could not be set.
int drivebus_thread_in_background(void);

/// Names the calling thread for the OS (top -H, ps -L, perf), cut to Linux's 15 bytes. Foundation's
/// `Thread.name` does not do it reliably on Linux: set before `start` it never reaches the OS, and
/// set from the thread it races with `start`. Returns 0, or an error number.
int drivebus_thread_name(const char *name);

#endif
