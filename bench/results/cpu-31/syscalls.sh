#!/bin/bash
# The fifteenth stop: system calls of the control plane over 4 s of `bench cluster`'s rate phase
# (after its 20,000 warm-up), counted by perf's syscall tracepoints; divide by the creates of those
# seconds (~ the writev count: one response each). usage: syscalls.sh CHECKOUT OUTDIR
# (2026-12-07: fcntl per create 3.94 on 8bc310b6, 2.16 with a request's reads sharing one look).
D=$1; OUT=$2; mkdir -p $OUT
cd $D && node packages/dsec/dist/src/cli/main.js bench cluster --creates 40000 --warmup 20000 --batch-count 200 --real-count 0 --out $OUT > $OUT/log 2>&1 &
B=$!
for i in $(seq 200); do grep -q "^rate: " $OUT/log 2>/dev/null && break; sleep 0.2; done
sleep 8.5
CP=$(pgrep -f "main.js control --listen" | head -1)
perf stat -e 'syscalls:sys_enter_writev,syscalls:sys_enter_write,syscalls:sys_enter_read,syscalls:sys_enter_pwrite64,syscalls:sys_enter_pread64,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_pwait,syscalls:sys_enter_fcntl,syscalls:sys_enter_futex,syscalls:sys_enter_epoll_ctl,syscalls:sys_enter_mprotect,syscalls:sys_enter_madvise,syscalls:sys_enter_munmap,syscalls:sys_enter_mmap' -p $CP -o $OUT/stat.txt -- sleep 4
wait $B
grep -E '^rate' $OUT/log
