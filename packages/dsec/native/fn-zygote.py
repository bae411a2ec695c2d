# dsec fn zygote: the fork server of one FnCall worker sandbox (see edge/backends/fncall/README.md).
#
# The edge starts it with `crun exec` (under dsec-landlock: writes only beneath the scratch root,
# /dev/shm and /dev/mqueue) and talks to it over two pipes: requests on stdin, answers on fd 3.
# It imports the standard library once; then, per call:
#
#   zygote Z ──fork──▶ leader C ──fork──▶ user process U (python: the code runs in U itself,
#                                          no interpreter start; node/bash: U execs the runtime)
#
# Z forks C *before* a request arrives and never reads one itself: C reads it, so Z's memory (which
# every later call inherits through fork) never holds any call's code, input or output. C makes
# a fresh scratch dir, writes the files, runs U in a session of its own with its own Landlock
# domain, a clean environment and no fd but stdin/stdout/stderr, collects U's output up to the cap
# (counting the rest), kills U's session at exit or timeout, and answers on fd 3. When C is
# reaped, Z wipes the scratch root, /dev/shm and /dev/mqueue, removes every SysV IPC object (shared
# memory, message queues, semaphores: the worker's IPC namespace outlives calls, and the sandbox may
# not make a fresh one per call), compares /dev and the scratch roots' metadata with what it saw at
# its start, and says what it could not put back; the edge then checks from outside that no process
# of the call is left and that its overlay upper (where any metadata change outside the scratch root
# lands) is as it was, before it hands the worker on.
# Z, C and (for python) U are not dumpable: nothing in the sandbox can ptrace them or open their
# /proc/<pid>/fd, mem or environ, so a call cannot reach the channel or another call's process.

import base64, ctypes, json, os, select, shutil, signal, sys, time

# Imported once here, shared by every call's fork: what reward functions and tests use most.
import array, bisect, collections, copy, dataclasses, datetime, decimal, enum, fractions, functools, hashlib  # noqa: F401,E401
import heapq, io, itertools, math, operator, random, re, statistics, string, struct, textwrap, types, typing  # noqa: F401,E401
import traceback, unittest, subprocess, tempfile, pathlib, contextlib, abc, numbers, pprint, csv  # noqa: F401,E401

SCRATCH = sys.argv[1]
CHANNEL_IN, CHANNEL_OUT = 0, 3
LIBC = ctypes.CDLL(None, use_errno=True)
PR_SET_DUMPABLE = 4
SYS_landlock_create_ruleset, SYS_landlock_restrict_self = 444, 446
FS_MAKE_BLOCK = 1 << 11
WIPED = ('/dev/shm', '/dev/mqueue')
IPC_RMID = 0
# /proc/sysvipc/<kind> lists the objects of this IPC namespace (id in the second column); each kind's remover.
SYSV = (('shm', lambda i: LIBC.shmctl(i, IPC_RMID, None)), ('msg', lambda i: LIBC.msgctl(i, IPC_RMID, None)), ('sem', lambda i: LIBC.semctl(i, 0, IPC_RMID)))
# After the program exits, output from what it left running is kept while it keeps coming, up to this quiet spell.
QUIET_S = 0.1


def not_dumpable():
    LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def own_landlock_domain():
    """A nested Landlock domain for U: a process one call leaves behind cannot ptrace the next."""
    attr = ctypes.c_uint64(FS_MAKE_BLOCK)
    fd = LIBC.syscall(SYS_landlock_create_ruleset, ctypes.byref(attr), ctypes.sizeof(attr), 0)
    if fd < 0:
        return
    LIBC.syscall(SYS_landlock_restrict_self, fd, 0)
    os.close(fd)


def read_line(fd):
    buf = bytearray()
    while True:
        b = os.read(fd, 65536 if not buf else 1 << 20)
        if not b:
            return None
        buf += b
        if buf.endswith(b'\n'):
            return bytes(buf)


def read_request(fd):
    # Exactly one line per call: read byte counts the edge sends first, so C never reads into the next call.
    head = b''
    while not head.endswith(b'\n'):
        b = os.read(fd, 1)
        if not b:
            return None
        head += b
    n = int(head)
    body = bytearray()
    while len(body) < n:
        b = os.read(fd, min(1 << 20, n - len(body)))
        if not b:
            return None
        body += b
    return json.loads(body)


def send(obj):
    data = (json.dumps(obj) + '\n').encode()
    while data:
        data = data[os.write(CHANNEL_OUT, data):]


def running(pid):
    """A process is gone when every thread of it is (a leader that left with the raw exit syscall
    shows Z while another thread of it runs on)."""
    try:
        tids = os.listdir('/proc/%d/task' % pid)
    except OSError:
        return False
    for tid in tids:
        try:
            with open('/proc/%d/task/%s/stat' % (pid, tid)) as f:
                state = f.read().rsplit(')', 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in ('Z', 'X'):
            return True
    return False


def others():
    me = os.getpid()
    return [int(d) for d in os.listdir('/proc') if d.isdigit() and int(d) not in (1, me) and running(int(d))]


def end_leftovers():
    """Before the wipe, nothing the call started may run: what its session's kill left (a double
    fork, setsid, a new process group) would write into the scratch dirs after they were wiped,
    for the next call to meet (red team round three). Killed ones (the call's group) are given a
    moment to die; whatever still runs then is killed here, and the worker is damaged."""
    deadline = time.monotonic() + 0.2
    left = others()
    while left and time.monotonic() < deadline:
        time.sleep(0.005)
        left = others()
    if not left:
        return None
    names = []
    for pid in left:
        try:
            with open('/proc/%d/comm' % pid) as f:
                names.append('%d %s' % (pid, f.read().strip()))
        except OSError:
            names.append(str(pid))
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + 2
    while others() and time.monotonic() < deadline:
        time.sleep(0.005)
    return 'the call left %d process(es) running (%s)' % (len(left), ', '.join(names))


def wipe(path):
    ok = True
    for name in os.listdir(path):
        p = os.path.join(path, name)
        try:
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)
        except OSError:
            ok = False
    return ok


def sysv_objects():
    """The SysV IPC objects of the worker's IPC namespace, as (kind, id) pairs."""
    found = []
    for kind, _ in SYSV:
        try:
            with open('/proc/sysvipc/' + kind) as f:
                found += [(kind, int(line.split()[1])) for line in f.readlines()[1:] if line.strip()]
        except FileNotFoundError:  # a kernel without SysV IPC
            pass
    return found


def sysv_clear():
    """Removes every SysV IPC object a call made; what stays (one its uid may not remove) is named."""
    found = sysv_objects()
    if not found:
        return None
    removers = dict(SYSV)
    for kind, i in found:
        removers[kind](i)
    left = sysv_objects()
    return 'the call left SysV IPC objects that could not be removed (%s)' % ', '.join('%s %d' % o for o in left) if left else None


def metadata(path, kind):
    """What a call may change of a path outside its scratch dirs but must not. `kind`: 'own' (the
    container's /dev tmpfs: mode, owner, xattrs and ctime, which any change of mode, owner, times or
    xattrs moves), 'root' (a scratch root or /dev/pts: not its times, which move with what is made
    in it), 'bound' (mounted from the host: in a user namespace crun binds the host's device nodes,
    whose owner and times are the host's to change; mode and xattrs)."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return ('gone', e.errno)
    try:
        xattrs = tuple((n, os.getxattr(path, n, follow_symlinks=False)) for n in sorted(os.listxattr(path, follow_symlinks=False)))
    except OSError:
        xattrs = None
    owner = {'own': (st.st_uid, st.st_gid, st.st_ctime_ns), 'root': (st.st_uid, st.st_gid), 'bound': ()}[kind]
    return (st.st_mode, st.st_rdev, st.st_ino, xattrs) + owner


def fixed_paths():
    """/dev (the container's tmpfs, which the edge's check of the overlay does not see) and its
    entries, and the scratch roots, each with its kind (see metadata). A call cannot add or remove
    entries there (Landlock)."""
    dev = os.lstat('/dev').st_dev
    paths = ['/dev'] + [os.path.join('/dev', n) for n in sorted(os.listdir('/dev'))] + ['/dev/pts/ptmx', SCRATCH]

    def kind(p):
        if p in (SCRATCH, '/dev/pts') + WIPED:
            return 'root'
        try:
            return 'own' if os.lstat(p).st_dev == dev else 'bound'
        except OSError:
            return 'own'
    return [(p, kind(p)) for p in paths]


def metadata_changes(fixed):
    changed = [p for p, (kind, before) in fixed.items() if metadata(p, kind) != before]
    return 'the call changed the mode, owner, times or xattrs of %s' % ', '.join(changed[:5]) if changed else None


def run_user(req, workdir, out_w, err_w, stdin_fd):
    """In U: the call's own process. Never returns."""
    try:
        os.setsid()
        own_landlock_domain()
        os.dup2(stdin_fd, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 1 << 16)
        os.chdir(workdir)
        env = {'PATH': '/usr/local/bin:/usr/bin:/bin', 'HOME': workdir, 'TMPDIR': workdir, 'LANG': 'C.UTF-8', 'PYTHONDONTWRITEBYTECODE': '1'}
        env.update(req.get('env') or {})
        args = req.get('args') or []
        runtime = req['runtime']
        if runtime == 'python':
            os.environ.clear()
            os.environ.update(env)
            random.seed()
            sys.argv = ['main.py'] + args
            sys.stdin = io.TextIOWrapper(io.FileIO(0, 'r', closefd=False))
            sys.stdout = io.TextIOWrapper(io.FileIO(1, 'w', closefd=False), line_buffering=False)
            sys.stderr = io.TextIOWrapper(io.FileIO(2, 'w', closefd=False), line_buffering=True)
            sys.path[0:0] = [workdir]
            main = types.ModuleType('__main__')
            main.__file__ = os.path.join(workdir, 'main.py')
            sys.modules['__main__'] = main
            code = 0
            try:
                exec(compile(req['code'], main.__file__, 'exec'), main.__dict__)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if not isinstance(e.code, int) and e.code is not None:
                    print(e.code, file=sys.stderr)
            except BaseException as e:
                # From the user's own frames on, as `python3 main.py` shows it: the frame of this
                # runner (loaded from a string) is not the agent's to see. A SyntaxError has none.
                tb = e.__traceback__
                while tb is not None and tb.tb_frame.f_code.co_filename != main.__file__:
                    tb = tb.tb_next
                traceback.print_exception(type(e), e, tb)
                code = 1
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            except BaseException:
                pass
            os._exit(code & 0xFF)
        prog = {'node': ['node', 'main.js'], 'bash': ['bash', 'main.sh']}[runtime]
        os.execvpe(prog[0], prog + args, env)
    except BaseException as e:
        try:
            os.write(2, ('dsec fn: cannot start the call: %s\n' % e).encode())
        finally:
            os._exit(127)


def lead():
    """In C: one call, from request to answer. Never returns."""
    req = read_request(CHANNEL_IN)
    if req is None:
        os._exit(0)
    os.dup2(os.open('/dev/null', os.O_RDONLY), CHANNEL_IN)
    started = time.monotonic()
    workdir = os.path.join(SCRATCH, 'call')
    os.mkdir(workdir, 0o700)
    for rel, b64 in (req.get('files') or {}).items():
        p = os.path.normpath(os.path.join(workdir, rel))
        if not p.startswith(workdir + '/'):
            send({'type': 'result', 'error': 'file path %s leaves the scratch dir' % rel})
            os._exit(0)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, 'wb') as f:
            f.write(base64.b64decode(b64))
    main = {'python': 'main.py', 'node': 'main.js', 'bash': 'main.sh'}[req['runtime']]
    with open(os.path.join(workdir, main), 'w') as f:
        f.write(req['code'])
    stdin_path = os.path.join(SCRATCH, '.stdin')
    with open(stdin_path, 'wb') as f:
        f.write(base64.b64decode(req.get('stdin') or ''))
    stdin_fd = os.open(stdin_path, os.O_RDONLY)
    os.unlink(stdin_path)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as e:
        send({'type': 'result', 'error': 'cannot fork the call (the worker is out of processes?): %s' % e})
        os._exit(0)
    if pid == 0:
        run_user(req, workdir, out_w, err_w, stdin_fd)
    os.close(out_w)
    os.close(err_w)
    os.close(stdin_fd)
    cap = int(req['maxOutputBytes'])
    kept = {out_r: bytearray(), err_r: bytearray()}
    total = {out_r: 0, err_r: 0}
    deadline = started + int(req['timeoutMs']) / 1000.0
    open_fds = [out_r, err_r]
    timed_out = False
    status = None
    quiet_until = None  # once U has exited: output still coming from what it left keeps the call for QUIET_S
    pidfd = os.pidfd_open(pid)  # readable once U exits: one select waits for output and exit alike
    while True:
        now = time.monotonic()
        if now >= deadline:
            timed_out = status is None
            break
        if status is not None and (not open_fds or now >= quiet_until):
            break
        wait = deadline - now if status is None else min(deadline - now, quiet_until - now)
        ready = select.select(open_fds + ([pidfd] if status is None else []), [], [], max(0.0, wait))[0]
        for fd in ready:
            if fd == pidfd:
                _, status = os.waitpid(pid, 0)
                quiet_until = time.monotonic() + QUIET_S
                continue
            b = os.read(fd, 65536)
            if not b:
                open_fds.remove(fd)
                continue
            if quiet_until is not None:
                quiet_until = time.monotonic() + QUIET_S
            total[fd] += len(b)
            room = cap - len(kept[fd])
            if room > 0:
                kept[fd] += b[:room]
    os.close(pidfd)
    # The call's whole session goes, whatever it left running (a double fork that left the
    # session is the edge's to find: it replaces the worker).
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    if status is None:
        _, status = os.waitpid(pid, 0)
    for fd in (out_r, err_r):
        os.close(fd)
    exit_code = 137 if timed_out else (os.waitstatus_to_exitcode(status) if hasattr(os, 'waitstatus_to_exitcode') else status >> 8)
    if exit_code < 0:
        exit_code = 128 - exit_code
    send({
        'type': 'result',
        'exitCode': exit_code,
        'timedOut': timed_out,
        'stdout': base64.b64encode(bytes(kept[out_r])).decode(),
        'stderr': base64.b64encode(bytes(kept[err_r])).decode(),
        'stdoutBytes': total[out_r],
        'stderrBytes': total[err_r],
        'runMs': round((time.monotonic() - started) * 1000, 3),
    })
    os._exit(0)


def main():
    not_dumpable()
    os.makedirs(SCRATCH, exist_ok=True)
    # A file made in the scratch root copies it up to the overlay's upper now (which marks the root
    # dir there), not in the first call: the edge takes the upper as it is at rest once it hears ready.
    os.close(os.open(os.path.join(SCRATCH, '.ready'), os.O_WRONLY | os.O_CREAT, 0o600))
    os.unlink(os.path.join(SCRATCH, '.ready'))
    fixed = {p: (kind, metadata(p, kind)) for p, kind in fixed_paths()}
    send({'type': 'ready', 'pid': os.getpid()})
    while True:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            lead()
        _, status = os.waitpid(pid, 0)
        leftovers = end_leftovers()
        clean = wipe(SCRATCH)
        for d in WIPED:
            if os.path.isdir(d):
                clean = wipe(d) and clean
        leader = os.waitstatus_to_exitcode(status) if hasattr(os, 'waitstatus_to_exitcode') else status
        # Whatever the call left that the next one would meet and Z cannot put back: the edge replaces the worker.
        damage = leftovers or sysv_clear() or metadata_changes(fixed)
        send({'type': 'done', 'clean': clean, 'leader': leader, **({'damage': damage} if damage else {})})


if __name__ == '__main__':
    main()
