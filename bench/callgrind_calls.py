#!/usr/bin/env python3
"""Per-request calls of the functions that cost a request more than their instructions show.

  callgrind_calls.py <callgrind.out> <requests> [callers to list, default 6]

Reads a callgrind output file (every thread of the server, counting on for exactly <requests>
requests, as bench/request_cost.sh records it) and prints, per request, how many times the
server called the allocator, took a lock, woke a thread, and which of those calls come from
where. Call counts are exact (callgrind counts every call), so two binaries compare without
the machine's noise.
"""
import collections
import re
import sys

TOP = int(sys.argv[3]) if len(sys.argv) > 3 else 6

# category -> regex over the demangled function name (callgrind writes demangled names).
CATEGORIES = [
    ("allocations", re.compile(
        r"^(malloc|calloc|realloc|posix_memalign|aligned_alloc|memalign|"
        r"operator new(\[\])?\(.*)$")),
    ("frees", re.compile(r"^(free|operator delete(\[\])?\(.*)$")),
    ("mutex locks", re.compile(
        r"^(pthread_mutex_lock|pthread_mutex_trylock|pthread_rwlock_(rd|wr)lock|"
        r"absl::\w+::Mutex::(Lock|ReaderLock|TryLock|ReaderTryLock|LockWhen.*)\(.*)$")),
    ("slow-path locks (contention or waiters)", re.compile(
        r"^absl::\w+::Mutex::(LockSlow|UnlockSlow|LockSlowWithDeadline)\(.*$")),
    ("thread wake-ups (condvar signal/broadcast)", re.compile(
        r"^(pthread_cond_signal|pthread_cond_broadcast|"
        r"absl::\w+::CondVar::(Signal|SignalAll)\(.*|"
        r"std::condition_variable::notify_(one|all)\(.*)$")),
    ("waits (condvar/futex wait)", re.compile(
        r"^(pthread_cond_wait|pthread_cond_timedwait|pthread_cond_clockwait|"
        r"absl::\w+::CondVar::Wait.*|absl::\w+::Mutex::Await.*)$")),
    ("syscall wrappers", re.compile(
        r"^(read|write|writev|sendmsg|recvmsg|send|recv|epoll_wait|epoll_ctl|eventfd_write|"
        r"eventfd_read|futex|syscall|clock_gettime|__clock_gettime|sched_yield|poll)$")),
]


def main():
    path, requests = sys.argv[1], int(sys.argv[2])
    names = {}          # "(id)" -> name, for the compressed cfn=/fn= records
    calls = collections.Counter()
    callers = collections.defaultdict(collections.Counter)
    fn = cfn = None
    with open(path, errors="replace") as f:
        for line in f:
            if not line.startswith(("fn=", "cfn=", "calls=")):
                continue
            key, _, rest = line.rstrip("\n").partition("=")
            if key in ("fn", "cfn"):
                m = re.match(r"\((\d+)\)(?: (.*))?$", rest)
                if m:
                    if m.group(2) is not None:
                        names[m.group(1)] = m.group(2)
                    name = names.get(m.group(1), "?")
                else:
                    name = rest
                if key == "fn":
                    fn = name
                else:
                    cfn = name
            elif key == "calls" and cfn is not None:
                n = int(rest.split()[0])
                calls[cfn] += n
                callers[cfn][fn] += n
                cfn = None
    for title, rx in CATEGORIES:
        # A call from inside the category (operator new -> malloc) is the same event once.
        hit = {}
        for n in calls:
            if rx.match(n):
                c = sum(v for k, v in callers[n].items() if not rx.match(k or ""))
                if c:
                    hit[n] = c
        total = sum(hit.values())
        print(f"{title}: {total / requests:.1f} per request")
        for n, c in sorted(hit.items(), key=lambda kv: -kv[1])[:4]:
            top = ", ".join(f"{k.split('(')[0][-60:]} {v / requests:.1f}"
                            for k, v in callers[n].most_common(TOP) if not rx.match(k or ""))
            print(f"    {n.split('(')[0]} {c / requests:.1f}  <- {top}")


if __name__ == "__main__":
    main()
